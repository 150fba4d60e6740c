"""`sojourn ps` over 1,000 workspaces (issue 4 target: <= 1 s).

    .venv/bin/python bench/bench_workspaces.py                    # local repository
    .venv/bin/python bench/bench_workspaces.py --s3 s3://bucket/prefix   # also an S3 server (AWS_* env)
    .venv/bin/python bench/bench_workspaces.py --moto             # also moto's S3 mock, started here

The workspaces are written the way sojourn writes them, through the workspace store: the
meta and name objects, an epoch taken by compare-and-swap, then `created`, `authority`,
`allocation`, `started`, `capsule` and `stopped` events and the summary. One in ten is still
running (its holder is this process, alive, so `ps` does not reap it); one in ten got a `note`
event after its summary was saved, so `ps` folds that one in (one more read). Timed:

* `sojourn ps` and `sojourn ps --json`: the command, end to end (a new interpreter each time);
* `ops.ps(repo)` in this process (what the command spends after start-up).

Each is run --reps times; the table shows the median and the best.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
sys.path.insert(0, str(SRC))

from sojourn import ops  # noqa: E402
from sojourn.repository.repo import open_repository  # noqa: E402
from sojourn.workspace import records as R  # noqa: E402
from sojourn.workspace.authority import take  # noqa: E402
from sojourn.workspace.liveness import boot_id, hostname, process_start  # noqa: E402
from sojourn.workspace.store import WorkspaceStore  # noqa: E402


def make_one(store: WorkspaceStore, i: int) -> None:
    command = R.Command(script="train.py", argv=["--epochs", "3", "--seed", str(i)], cwd="/work", python=sys.executable)
    meta = store.create(command, default_name="train")
    ws, al = meta["id"], R.new_id("al")
    store.append(ws, 0, al, {"type": "created", "name": meta["name"], "command": meta["command"]})
    epoch = take(store, R.initial(meta), al, "run")
    pid = os.getpid()
    alloc = R.Allocation(id=al, provider="local", machine=hostname(), host=hostname(), boot_id=boot_id(), pid=pid,
                         pid_start=process_start(pid), python=sys.executable, memory_limit=None, started=R.now(),
                         epoch=epoch)
    events: list[dict[str, object]] = [
        {"type": "allocation", "allocation": asdict(alloc)},
        {"type": "started", "allocation": al, "session_pid": pid, "session_pid_start": process_start(pid),
         "python_version": "3.11.7", "python": "3.11.7", "arch": "x86_64", "platform": "linux"}]
    if i % 10 != 0:  # nine in ten stopped on a capsule
        cap = f"cap_{i:032x}"
        entry = R.CapsuleEntry(id=cap, parent=None, reason="suspend", where="train.py:12 in <module>",
                               size=1 << 20, time=R.now(), allocation=al, verified=True)
        events += [{"type": "capsule", "capsule": asdict(entry)},
                   {"type": "stopped", "allocation": al, "reason": "suspended", "detail": "", "exit_code": 75,
                    "max_rss": 1 << 28, "spend": 0.0, "state": R.state_after_stop("suspended", cap), "capsule": cap}]
    store.append(ws, epoch, al, *events)
    store.record(ws)  # the summary, as every writer leaves it
    if i % 10 == 5:
        store.append(ws, epoch, al, {"type": "note", "message": "a newer event than the summary"})


def populate(url: str, n: int, jobs: int) -> float:
    t0 = time.perf_counter()
    with open_repository(url, create=True) as repo:
        store = WorkspaceStore(repo)
        with ThreadPoolExecutor(jobs) as pool:
            list(pool.map(lambda i: make_one(store, i), range(n)))
    return time.perf_counter() - t0


def time_cli(url: str, args: list[str], reps: int, env: dict[str, str]) -> list[float]:
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "sojourn.cli.main", "ps", "--repo", url, *args], env=env,
                           capture_output=True, text=True, timeout=300)
        out.append(time.perf_counter() - t0)
        if p.returncode != 0:
            raise SystemExit(f"`sojourn ps` failed: {p.stderr}")
    return out


def time_ops(url: str, reps: int, n: int) -> list[float]:
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        rows = ops.ps(url)
        out.append(time.perf_counter() - t0)
        if len(rows) != n:
            raise SystemExit(f"ops.ps listed {len(rows)} workspaces, not {n}")
    return out


def bench(label: str, url: str, n: int, reps: int, jobs: int, env: dict[str, str]) -> list[tuple[str, list[float]]]:
    made = populate(url, n, jobs)
    print(f"{label}: {n} workspaces written through the workspace store in {made:.1f} s ({url})", flush=True)
    out = [(f"{label}: ops.ps, first (folds 1 in 10)", time_ops(url, 1, n))]  # saves those summaries
    out.append((f"{label}: ops.ps (in process)", time_ops(url, reps, n)))
    out.append((f"{label}: `sojourn ps` (end to end)", time_cli(url, [], reps, env)))
    out.append((f"{label}: `sojourn ps --json` (end to end)", time_cli(url, ["--json"], reps, env)))
    for k, ts in out:
        print(f"  {k}: {', '.join(f'{t:.3f}' for t in ts)} s", flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=1000, help="workspaces (default 1000)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--jobs", type=int, default=16, help="threads writing the workspaces")
    ap.add_argument("--s3", help="also an S3 repository: s3://bucket/prefix (credentials and endpoint: AWS_* env)")
    ap.add_argument("--moto", action="store_true", help="also S3, on moto's server started here (a mock: "
                                                        "its latency says little about a real store)")
    ns = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="sojourn-bench-ws-"))
    os.environ["SOJOURN_HOME"] = str(root / "home")
    os.environ["SOJOURN_NOTICES"] = "none"
    env = dict(os.environ, PYTHONPATH=str(SRC))
    results = bench("local", str(root / "repo"), ns.n, ns.reps, ns.jobs, env)
    server = None
    s3 = ns.s3
    if ns.moto and not s3:
        sys.path.insert(0, str(ROOT))
        from tests.repository.s3server import s3_client, start_moto

        server = start_moto()
        os.environ.update(server.env())
        env.update(server.env())
        s3_client(server).create_bucket(Bucket="sojourn-bench")
        s3 = "s3://sojourn-bench/ps"
    try:
        if s3:
            results += bench("S3 (moto)" if server else "S3", s3, ns.n, ns.reps, ns.jobs, env)
    finally:
        if server is not None:
            server.stop()
    print()
    width = max(len(k) for k, _ in results)
    print(f"{'`sojourn ps` over ' + str(ns.n) + ' workspaces':<{width}} {'median':>8} {'best':>8}  target <= 1 s")
    print("-" * (width + 34))
    ok = True
    for label, ts in results:
        med = statistics.median(ts)
        verdict = "ok" if med <= 1.0 else "MISSED"
        if "S3" not in label and "first" not in label:
            ok = ok and med <= 1.0
        print(f"{label:<{width}} {med:>7.3f}s {min(ts):>7.3f}s  {verdict}")
    print(f"({os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}; reps {ns.reps})")
    import shutil

    shutil.rmtree(root, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
