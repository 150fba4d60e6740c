"""Cost of running under sojourn: steady-state overhead, start-up, signal -> pause latency.

    python bench/bench_execution.py [--rounds N]

Each workload is a small script timed from inside (the loop only, min over rounds), run by
plain ``python`` and by ``python -m sojourn.execution run`` alternately. Targets (issue 3):
<= 2% on a numpy/torch loop, <= 10% on a tight pure-Python loop, start-up <= 300 ms over
python, signal -> paused at a statement boundary <= 5 ms while Python code runs.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENV = dict(os.environ, PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")

WORKLOADS = {
    "tight pure-Python loop": ("""
        def tight(n):
            s = 0
            for i in range(n):
                s += i * i
                if s > 1000000007:
                    s -= 1000000007
            return s
        """, "tight(N)", 2_000_000),
    "call-heavy pure-Python loop": ("""
        def add(a, b):
            return a + b
        def sq(x):
            return x * x
        def calls(n):
            s = 0
            for i in range(n):
                s = add(s, sq(i)) % 1000003
            return s
        """, "calls(N)", 1_000_000),
    "numpy loop (64x64 matmul)": ("""
        import numpy as np
        rng = np.random.default_rng(0)
        A = rng.standard_normal((64, 64)); B = rng.standard_normal((64, 64))
        def npl(n):
            a = A
            for i in range(n):
                c = a @ B
                c = np.tanh(c)
                a = c / (np.abs(c).sum() + 1.0)
            return a
        """, "npl(N)", 20_000),
    "torch training loop (MLP, SGD)": ("""
        import torch
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x = torch.randn(64, 32); y = torch.randn(64, 1)
        def step():
            opt.zero_grad()
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            opt.step()
            return loss
        def train(n):
            for i in range(n):
                loss = step()
            return loss
        torch.set_num_threads(1)
        """, "train(N)", 3_000),
}

TIMED = """
import time
{setup}
N = {n}
best = float("inf")
for _ in range({repeats}):
    t0 = time.perf_counter()
    {call}
    best = min(best, time.perf_counter() - t0)
print(best)
"""


def _run(cmd: list[str], cwd: str) -> float:
    p = subprocess.run(cmd, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(p.stderr)
    return float(p.stdout.strip().splitlines()[-1])


def overhead(tmp: str, rounds: int) -> None:
    print(f"Steady-state overhead (min over {rounds} interleaved rounds, loop timed inside the script)")
    for name, (setup, call, n) in WORKLOADS.items():
        if "torch" in setup:
            try:
                import torch  # noqa: F401
            except ImportError:
                print(f"  {name:34s} skipped (no torch)")
                continue
        path = Path(tmp) / f"w{abs(hash(name))}.py"
        path.write_text(TIMED.format(setup=textwrap.dedent(setup), call=call, n=n, repeats=3))
        plain = under = float("inf")
        for _ in range(rounds):
            plain = min(plain, _run([sys.executable, str(path)], tmp))
            under = min(under, _run([sys.executable, "-m", "sojourn.execution", "--repo", f"{tmp}/repo", "run", str(path)], tmp))
        per = 1e9 / n
        print(f"  {name:34s} python {plain * per:9.1f} ns/iter | sojourn {under * per:9.1f} ns/iter | {100 * (under / plain - 1):+6.1f}%")


def startup(tmp: str, rounds: int) -> None:
    path = Path(tmp) / "hello.py"
    path.write_text("print('hello')\n")
    def wall(cmd: list[str]) -> float:
        t0 = time.perf_counter()
        subprocess.run(cmd, cwd=tmp, env=ENV, capture_output=True, check=True)
        return time.perf_counter() - t0
    plain = min(wall([sys.executable, str(path)]) for _ in range(rounds))
    under = min(wall([sys.executable, "-m", "sojourn.execution", "--repo", f"{tmp}/repo", "run", str(path)]) for _ in range(rounds))
    print(f"Start-up of a small script: python {plain * 1e3:.0f} ms | sojourn {under * 1e3:.0f} ms | +{(under - plain) * 1e3:.0f} ms")


LATENCY = """
import sys, time
from sojourn.execution.runner import run_script
def report(event):
    print("PAUSED_AT", event.paused_at, flush=True)
run_script(sys.argv[1], [], repo=sys.argv[2], on_capsule=report)
"""

SPIN = """
import sys
print("ready", flush=True)
def work(n):
    s = 0
    for i in range(n):
        s += i % 7
    return s
while True:
    work(1000)
"""


def latency(tmp: str, rounds: int) -> None:
    driver = Path(tmp) / "driver.py"
    driver.write_text(LATENCY)
    spin = Path(tmp) / "spin.py"
    spin.write_text(SPIN)
    samples = []
    for _ in range(rounds):
        p = subprocess.Popen([sys.executable, str(driver), str(spin), f"{tmp}/repo"], cwd=tmp, env=ENV,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert p.stdout is not None
        p.stdout.readline()
        time.sleep(0.2)
        t_send = time.perf_counter()
        os.kill(p.pid, signal.SIGTERM)
        out, _ = p.communicate(timeout=60)
        for line in out.splitlines():
            if line.startswith("PAUSED_AT"):
                samples.append(float(line.split()[1]) - t_send)
    samples.sort()
    med = samples[len(samples) // 2]
    print(f"Signal -> paused at a statement boundary (pure-Python loop), {len(samples)} runs: "
          f"median {med * 1e3:.3f} ms, max {samples[-1] * 1e3:.3f} ms")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--only", choices=["overhead", "startup", "latency"])
    args = ap.parse_args()
    print(f"Python {sys.version.split()[0]} on {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory() as tmp:
        if args.only in (None, "startup"):
            startup(tmp, max(args.rounds, 5))
        if args.only in (None, "latency"):
            latency(tmp, max(args.rounds, 5))
        if args.only in (None, "overhead"):
            overhead(tmp, args.rounds)


if __name__ == "__main__":
    main()
