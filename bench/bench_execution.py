"""Cost of running under sojourn: steady-state overhead, start-up, signal -> pause latency.

    python bench/bench_execution.py [--rounds N] [--only overhead|startup|latency|waiting]

Everything is measured in this one run and printed as one table, against the targets of issue
3: <= 2% on a numpy/torch training loop, <= 10% on a tight pure-Python loop, start-up <= 300 ms
over python, signal -> paused at a statement boundary <= 5 ms while Python code runs; and
(issue 11) while a pause waits for library code to return, the program keeps >= 50 % of its
speed.

Each workload is a small script that times its own loop (min over repeats inside the
process), run by plain ``python`` and by ``python -m sojourn.execution run`` alternately, for
``--rounds`` rounds; the table shows the minimum of each, which is what is least disturbed by
other load on the machine.
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
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENV = dict(os.environ, PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
           OPENBLAS_NUM_THREADS="1")


@dataclass
class Workload:
    name: str
    setup: str
    call: str
    n: int
    target: float | None  # overhead limit in per cent, None: reported only
    needs: str = ""


WORKLOADS = [
    Workload("tight pure-Python loop", """
        def tight(n):
            s = 0
            for i in range(n):
                s += i * i
                if s > 1000000007:
                    s -= 1000000007
            return s
        """, "tight(N)", 2_000_000, 10.0),
    Workload("call-heavy pure-Python loop", """
        def add(a, b):
            return a + b
        def sq(x):
            return x * x
        def calls(n):
            s = 0
            for i in range(n):
                s = add(s, sq(i)) % 1000003
            return s
        """, "calls(N)", 1_000_000, None),
    Workload("numpy loop (64x64 matmul)", """
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
        """, "npl(N)", 20_000, 2.0, "numpy"),
    Workload("torch training loop (MLP, SGD)", """
        import torch
        torch.manual_seed(0)
        torch.set_num_threads(1)
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
        """, "train(N)", 3_000, 2.0, "torch"),
    Workload("torch DataLoader + tqdm + dropout", """
        import io, torch
        from torch.utils.data import DataLoader, TensorDataset
        from tqdm import tqdm
        torch.manual_seed(0)
        torch.set_num_threads(1)
        data = TensorDataset(torch.randn(4096, 32), torch.randn(4096, 1))
        loader = DataLoader(data, batch_size=32, shuffle=True)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Dropout(0.2),
                                    torch.nn.Linear(64, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        sink = io.StringIO()
        def epochs(n):
            for epoch in range(n):
                for xb, yb in tqdm(loader, file=sink, mininterval=0.5):
                    opt.zero_grad()
                    loss = ((model(xb) - yb) ** 2).mean()
                    loss.backward()
                    opt.step()
            return loss
        """, "epochs(N)", 6, 2.0, "torch"),
]

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


def _have(module: str) -> bool:
    if not module:
        return True
    return subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True).returncode == 0


Row = tuple[str, str, str, str, str, str]


def overhead(tmp: str, rounds: int) -> list[Row]:
    rows: list[Row] = []
    for w in WORKLOADS:
        if not _have(w.needs):
            rows.append((w.name, "-", "-", f"skipped (no {w.needs})", "", ""))
            continue
        path = Path(tmp) / f"w{abs(hash(w.name))}.py"
        path.write_text(TIMED.format(setup=textwrap.dedent(w.setup), call=w.call, n=w.n, repeats=5))
        plain = under = float("inf")
        for _ in range(rounds):
            plain = min(plain, _run([sys.executable, str(path)], tmp))
            under = min(under, _run([sys.executable, "-m", "sojourn.execution", "--repo", f"{tmp}/repo", "run",
                                     str(path)], tmp))
        pct = 100 * (under / plain - 1)
        unit, scale = ("ns/iter", 1e9 / w.n) if w.n > 100 else ("ms/epoch", 1e3 / w.n)
        target = f"<= {w.target:g}%" if w.target is not None else "-"
        ok = "" if w.target is None else ("ok" if pct <= w.target else "OVER")
        rows.append((f"{w.name} ({unit})", f"{plain * scale:.1f}", f"{under * scale:.1f}", f"{pct:+.1f}%", target, ok))
    return rows


def startup(tmp: str, rounds: int) -> list[Row]:
    """Wall time of a small script under plain python, under the engine alone, and under the
    whole ``sojourn run`` (CLI + supervisor + session process + workspace records). Sources
    are byte-compiled first, as ``pip install`` does: with PYTHONDONTWRITEBYTECODE set (as on
    some CI machines) an editable install would otherwise recompile ~50 modules per start."""
    import compileall

    compileall.compile_dir(str(ROOT / "src" / "sojourn"), quiet=1)
    path = Path(tmp) / "hello.py"
    path.write_text("print('hello')\n")
    env = dict(ENV, SOJOURN_HOME=f"{tmp}/home", SOJOURN_REPO=f"{tmp}/repo-cli")

    def wall(cmd: list[str]) -> float:
        t0 = time.perf_counter()
        subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, check=True)
        return time.perf_counter() - t0

    plain = engine = cli = float("inf")
    for _ in range(rounds):
        plain = min(plain, wall([sys.executable, str(path)]))
        engine = min(engine, wall([sys.executable, "-m", "sojourn.execution", "--repo", f"{tmp}/repo", "run", str(path)]))
        cli = min(cli, wall([sys.executable, "-m", "sojourn.cli.main", "run", str(path)]))
    rows: list[Row] = []
    for what, t in (("engine alone (python -m sojourn.execution run)", engine), ("`sojourn run` (supervisor + session)", cli)):
        extra = (t - plain) * 1e3
        rows.append((f"start-up, {what} (ms)", f"{plain * 1e3:.0f}", f"{t * 1e3:.0f}", f"+{extra:.0f} ms",
                     "<= +300 ms", "ok" if extra <= 300 else "OVER"))
    return rows


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


def latency(tmp: str, rounds: int) -> list[Row]:
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
    return [(f"signal -> paused, median of {len(samples)} (ms)", "-", f"{med * 1e3:.3f}",
             f"max {samples[-1] * 1e3:.3f}", "<= 5 ms", "ok" if samples[-1] <= 0.005 else "OVER")]


WAITING = """
import sys, time
from sojourn.execution import pause_status, request_pause
times = []
def add(a, b):
    return a + b
def work(k):
    if k == {half}:  # a pause that cannot land before map() returns
        request_pause("bench", deadline=600, action="continue")
    t0 = time.perf_counter()
    s = 0
    for i in range(20000):
        s = add(s, i)
    times.append(time.perf_counter() - t0)
    return s
{caller}
print(min(times[:{half}]), min(times[{half}:]))
"""


def waiting(tmp: str, rounds: int) -> list[Row]:
    """Speed of the program's own loop while a pause waits for the library code that called
    it to return (issue 11: at least half its speed), against the same loop before the
    request, in one process."""
    rows: list[Row] = []
    for name, caller in (("map(f, ...)", "list(map(work, range(40)))"),
                         ("a comprehension", "[work(k) for k in range(40)]")):
        path = Path(tmp) / "waiting.py"
        path.write_text(WAITING.format(half=20, caller=caller))
        plain = wait = float("inf")
        for _ in range(max(1, rounds // 2)):
            p = subprocess.run([sys.executable, "-m", "sojourn.execution", "--repo", f"{tmp}/repo", "run",
                                str(path)], cwd=tmp, env=ENV, capture_output=True, text=True, timeout=600)
            if p.returncode != 0:
                raise RuntimeError(p.stderr)
            a, b = map(float, p.stdout.split())
            plain, wait = min(plain, a), min(wait, b)
        speed = plain / wait
        rows.append((f"while a pause waits for {name} (us/iter, speed)", f"{plain / 20000 * 1e6:.3f}",
                     f"{wait / 20000 * 1e6:.3f}", f"{100 * speed:.0f}% speed", ">= 50%", "ok" if speed >= 0.5 else "UNDER"))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--only", choices=["overhead", "startup", "latency", "waiting"])
    args = ap.parse_args()
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        if args.only in (None, "startup"):
            rows += startup(tmp, max(args.rounds, 5))
        if args.only in (None, "latency"):
            rows += latency(tmp, max(args.rounds, 5))
        if args.only in (None, "waiting"):
            rows += waiting(tmp, args.rounds)
        if args.only in (None, "overhead"):
            rows += overhead(tmp, args.rounds)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"Python {sys.version.split()[0]} on {os.cpu_count()} CPUs (load {load:.1f}); min over {args.rounds} "
          "interleaved rounds")
    head: Row = ("measure", "python", "sojourn", "overhead", "target", "")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(6)]
    for i, r in enumerate([head, *rows]):
        print("| " + " | ".join(c.ljust(widths[k]) for k, c in enumerate(r)) + " |")
        if i == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")


if __name__ == "__main__":
    main()
