"""The main job on the embedded default: capture a live session, restore it elsewhere.

A small "session" builds real state (arrays and views of them, a torch model with its
optimizer, user functions and classes, RNGs mid-stream), captures it into the local
repository, then a *fresh interpreter* restores it, checks every fingerprint and shows
that the program would carry on exactly where it was.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap

SESSION = textwrap.dedent(
    '''
    import random, sys
    import numpy as np
    import sojourn

    random.seed(1); np.random.seed(2)
    data = np.random.rand(1000, 64)
    batch = data[100:132]              # a view: it must keep sharing memory with data
    gen = np.random.default_rng(7); gen.random(3)

    class Running:
        def __init__(self): self.n, self.total = 0, 0.0
        def add(self, x): self.n += 1; self.total += x; return self.total / self.n
    stats = Running()
    for x in data[:10, 0]: stats.add(float(x))
    scale = 2.5
    normalise = lambda v: v * scale / (1 + abs(v))      # a lambda with a global
    try:
        import torch
        torch.manual_seed(3)
        model = torch.nn.Sequential(torch.nn.Linear(64, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        loss = model(torch.tensor(batch, dtype=torch.float32)).pow(2).mean()
        loss.backward(); opt.step(); opt.zero_grad()
        del loss
    except ImportError:
        pass
    ref = sojourn.capture(globals(), sys.argv[1])
    print(ref.id)
    # What the program would do next, if it had not moved:
    print(repr((random.random(), float(np.random.rand()), float(gen.random()), stats.add(0.5), normalise(3.0))))
    '''
)

RESUME = textwrap.dedent(
    '''
    import sys, random
    import numpy as np
    import sojourn
    ns = sojourn.restore(sys.argv[2], sys.argv[1], into=globals())
    print(repr((random.random(), float(np.random.rand()), float(gen.random()), stats.add(0.5), normalise(3.0))))
    batch[0, 0] = -1.0
    print("view still shares memory with its base:", data[100, 0] == -1.0)
    if "model" in ns:
        import torch
        print("optimizer points at the model's own parameters:",
              opt.param_groups[0]["params"][0] is model[0].weight)
    '''
)


def main() -> int:
    repo = os.environ.get("SOJOURN_REPO") or os.path.expanduser("~/.sojourn/repo")
    os.makedirs(os.path.dirname(repo), exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        session = os.path.join(tmp, "session.py")
        resume = os.path.join(tmp, "resume.py")
        with open(session, "w") as f:
            f.write(SESSION)
        with open(resume, "w") as f:
            f.write(RESUME)
        print(f"1. a Python session builds its state and captures it into {repo}")
        out = subprocess.run([sys.executable, session, repo], capture_output=True, text=True, cwd=tmp)
        if out.returncode:
            print(out.stderr)
            return 1
        capsule, expected = out.stdout.split("\n")[:2]
        subprocess.run([sys.executable, "-m", "sojourn.cli.main", "inspect", capsule, "--repo", repo], cwd=tmp)
        print("\n2. a fresh interpreter verifies every fingerprint")
        subprocess.run([sys.executable, "-m", "sojourn.cli.main", "verify", capsule, "--repo", repo], cwd=tmp)
        print("\n3. a fresh interpreter restores it and carries on")
        out = subprocess.run([sys.executable, resume, repo, capsule], capture_output=True, text=True, cwd=tmp)
        if out.returncode:
            print(out.stderr)
            return 1
        got, *rest = out.stdout.split("\n")
        print("   next values, uninterrupted:", expected)
        print("   next values, after restore:", got)
        for line in rest:
            if line:
                print("  ", line)
        same = got == expected
        print("\nRESULT:", "the restored session carries on exactly where it was" if same else "MISMATCH")
        return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
