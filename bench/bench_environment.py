"""Environment benchmark: a capsule resumed on a bare interpreter, sojourn building what it
needs (``sojourn verify CAP --python BARE --build-env``) against a person doing the same by
hand (``uv venv`` + ``uv pip install`` of the same requirements, then ``sojourn verify CAP
--python ENV``), in one run, one table.

    .venv/bin/python bench/bench_environment.py                      # pandas + scikit-learn
    .venv/bin/python bench/bench_environment.py --libs small         # python-dateutil only
    .venv/bin/python bench/bench_environment.py --libs torch         # + torch (CPU wheel, --find-links)
    .venv/bin/python bench/bench_environment.py --python /usr/bin/python3.12

How each number is measured (wall time of the whole command, a fresh process each):

* cold: uv's cache is a new empty directory for each side (every wheel downloaded from the
  index), and sojourn's environment cache is empty;
* warm: uv's cache holds every wheel (the same cache for both sides), the environment is new;
* cached (sojourn only): the environment for the capsule's key is already built: what a
  second resume on the same machine costs (the probe, then the restore).

Sides alternate (baseline, sojourn) within each row. Both end with the same check: the
capsule restored in a fresh interpreter of the environment and every fingerprint compared.
The capsule is captured by this interpreter, which must have the libraries (the main venv).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
sys.path.insert(0, str(SRC))

CAPTURE = {
    "small": "import dateutil.relativedelta as rd\nns = {'d': rd.relativedelta(days=3)}\n",
    # torch from the machine's own wheel (a CPU build): UV_FIND_LINKS and SOJOURN_TORCH_BACKEND=none
    "torch": ("import numpy as np, pandas as pd, torch\nfrom sklearn.linear_model import LogisticRegression\n"
              "X = np.random.default_rng(0).normal(size=(200, 4)); y = (X[:, 0] > 0).astype(int)\n"
              "net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))\n"
              "ns = {'df': pd.DataFrame(X, columns=list('abcd')), 'model': LogisticRegression().fit(X, y),\n"
              "      'net': net, 'opt': torch.optim.AdamW(net.parameters())}\n"),
    "data": ("import numpy as np, pandas as pd\nfrom sklearn.linear_model import LogisticRegression\n"
             "X = np.random.default_rng(0).normal(size=(200, 4)); y = (X[:, 0] > 0).astype(int)\n"
             "ns = {'df': pd.DataFrame(X, columns=list('abcd')), 'model': LogisticRegression().fit(X, y)}\n"),
}


def bare_python(version: str = "3.12") -> str:
    found = sorted(glob.glob(str(Path.home() / f".pyenv/versions/{version}.*/bin/python{version}")))
    if not found:
        sys.exit("no bare Python 3.12 found: pass --python")
    return found[-1]


def run(cmd: list[str], env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}")
    return dt, p


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--libs", choices=sorted(CAPTURE), default="data")
    ap.add_argument("--python", default=None, help="the bare interpreter (default: pyenv's 3.12; 3.11 for torch)")
    ap.add_argument("--find-links", default=None,
                    help="a wheel directory for uv (default for --libs torch: /opt/wheels, a torch CPU wheel)")
    args = ap.parse_args()
    bare = args.python or bare_python("3.11" if args.libs == "torch" else "3.12")

    from sojourn.environment import plan
    from sojourn.environment.build import find_uv, sojourn_requirements

    uv = find_uv()
    tmp = Path(tempfile.mkdtemp(prefix="sojourn-bench-env-"))
    repo = str(tmp / "repo")
    base = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV",)}
    base["PYTHONPATH"] = str(SRC)
    links = args.find_links or ("/opt/wheels" if args.libs == "torch" and os.path.isdir("/opt/wheels") else None)
    if links:
        # torch's CPU build from a local wheel: uv is not sent to PyTorch's index
        base.update(UV_FIND_LINKS=links, SOJOURN_TORCH_BACKEND="none")
    cap = subprocess.run([sys.executable, "-c", CAPTURE[args.libs] + "import sojourn, sys\n"
                          "print(sojourn.capture(ns, repo=sys.argv[1]).id)", repo],
                         env=base, capture_output=True, text=True, check=True).stdout.strip()
    from sojourn.capsule import format as fmt
    from sojourn.repository.repo import open_repository

    with open_repository(repo) as r:
        m = fmt.load_manifest(r, cap)
    reqs = sorted(plan.requirement(n, p) for n, p in m.packages.items())
    print(f"capsule {cap}: {len(m.packages)} distributions ({', '.join(sorted(m.needs))} needed), "
          f"bare interpreter {bare}")
    sojourn_cli = [sys.executable, "-m", "sojourn.cli.main"]
    rows: list[tuple[str, float | None, float]] = []

    def baseline(uv_cache: Path, n: int) -> float:
        env = dict(base, UV_CACHE_DIR=str(uv_cache))
        venv = tmp / f"manual-{n}"
        t0 = time.perf_counter()
        run([uv, "venv", "--quiet", "--python", bare, str(venv)], env)
        run([uv, "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), *reqs,
             *sojourn_requirements()], env)
        run([*sojourn_cli, "verify", cap, "--repo", repo, "--python", str(venv / "bin" / "python")], env)
        return time.perf_counter() - t0

    def with_sojourn(uv_cache: Path, env_cache: Path) -> float:
        env = dict(base, UV_CACHE_DIR=str(uv_cache), SOJOURN_ENV_CACHE=str(env_cache))
        dt, p = run([*sojourn_cli, "verify", cap, "--repo", repo, "--python", bare, "--build-env"], env)
        assert "OK" in p.stdout, p.stdout
        return dt

    # cold: an empty uv cache each
    b_cold = baseline(tmp / "uv-cold-a", 0)
    s_cold = with_sojourn(tmp / "uv-cold-b", tmp / "envs-cold")
    rows.append(("cold (empty uv cache)", b_cold, s_cold))
    # warm: the uv cache of the cold sojourn run, new environments
    b_warm = baseline(tmp / "uv-cold-b", 1)
    s_warm = with_sojourn(tmp / "uv-cold-b", tmp / "envs-warm")
    rows.append(("warm (uv cache full)", b_warm, s_warm))
    # cached: the environment built by the warm run
    s_cached = with_sojourn(tmp / "uv-cold-b", tmp / "envs-warm")
    rows.append(("cached (environment built)", None, s_cached))

    print(f"\n{'resume onto a bare Python ' + m.environment.get('python', '') + ' capsule':<40} "
          f"{'uv venv + uv pip install':>26} {'sojourn --build-env':>20}")
    for name, b, s in rows:
        bs = f"{b:.1f} s" if b is not None else "-"
        print(f"{name:<40} {bs:>26} {s:>18.1f} s")
    print(json.dumps({"capsule": cap, "libs": args.libs, "packages": len(m.packages),
                      "rows": [{"case": n, "baseline_s": b, "sojourn_s": s} for n, b, s in rows]}))
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
