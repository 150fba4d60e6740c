"""Live move benchmark (issue 4): how long a program holding 1 GiB is paused by `sojourn move`.

    .venv/bin/python bench/bench_move.py               # 1 GiB of state (scaled down if RAM is short)
    .venv/bin/python bench/bench_move.py --size 256MiB

The targets: paused (pause -> first statement on the destination) <= 1.5 x the time to
write + read the capsule alone; the rest of the protocol adds <= 200 ms. Measured in one run,
on one repository (a local directory), with two machines from a machines config the bench
writes (`small` and `big`: local machines with different memory limits):

* baseline: the same state (numpy, random float64, so that compression cannot help)
  captured by ``sojourn.capture`` in one process, then restored (every chunk hash and every
  fingerprint checked, as the move's restore does) in a fresh interpreter with numpy
  imported before the clock starts; each timed inside its process; the page cache warm, as
  it is for the move's restore right after its capture. Every capture is of new bytes (a
  seed each), so that no chunk is already in the repository;
* the live move: ``sojourn run --on small --detach`` of a script holding the state and
  appending a timestamp per step (every 20 ms) to a file, then ``sojourn move WS --to big``.
  Paused comes from the ``move`` event (``paused_ms``: the source's pause to the
  destination's first statement); the capture's and the restore's own times inside the move
  come from the move's ``source`` marker and the ``move`` event; the gap in the step
  timestamps (less one step) cross-checks the paused time.

Protocol overhead = paused - (capture + restore inside the move).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"

STATE = """
import numpy as np
state = {{"weights": np.random.default_rng({seed}).random({n} // 8)}}  # float64: does not compress
"""

HOLDER = """
import os, sys, time
import numpy as np
ticks, stop = sys.argv[1], sys.argv[2]
{state}
i = 0
while not os.path.exists(stop):
    with open(ticks, "a") as f:
        f.write(f"{{i}} {{time.time():.6f}} {{os.getpid()}}\\n")
    i += 1
    time.sleep(0.02)
print("done", i, state["weights"].shape)
"""

BASE_CAPTURE = """
import json, sys, time
sys.path.insert(0, {src!r})
import sojourn
{state}
t0 = time.perf_counter()
ref = sojourn.capture({{"state": state}}, {repo!r})
print(json.dumps({{"capsule": ref.id, "seconds": time.perf_counter() - t0}}))
"""

BASE_RESTORE = """
import json, resource, sys, time
sys.path.insert(0, {src!r})
import numpy, sojourn
from sojourn.capsule.restore import restore_capsule
from sojourn.repository.repo import open_repository
t0, r0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
with open_repository({repo!r}) as r:
    ns = restore_capsule(r, {capsule!r}, check=True)
r1 = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({{"seconds": time.perf_counter() - t0, "user": r1.ru_utime - r0.ru_utime,
                  "system": r1.ru_stime - r0.ru_stime}}))
"""


def parse_size(text: str) -> int:
    t = text.strip().lower().replace("ib", "").replace("b", "")
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(t[-1:], 1)
    return int(float(t[:-1] if t[-1:] in "kmg" else t) * mult)


def available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


class Env:
    def __init__(self, root: Path):
        self.root = root
        self.work = root / "work"
        self.work.mkdir()
        self.repo = str(root / "repo")
        self.env = dict(os.environ, PYTHONPATH=str(SRC), SOJOURN_REPO=self.repo, SOJOURN_HOME=str(root / "home"),
                        SOJOURN_CACHE=str(root / "cache"), SOJOURN_NOTICES="none")
        self.env.pop("SOJOURN_FAULT", None)

    def sojourn(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
        p = subprocess.run([sys.executable, "-m", "sojourn.cli.main", *args], cwd=self.work, env=self.env,
                           capture_output=True, text=True, timeout=timeout)
        if p.returncode != 0:
            raise SystemExit(f"`sojourn {' '.join(args)}` failed ({p.returncode}):\n{p.stderr}")
        return p

    def py(self, code: str, timeout: float = 900) -> dict[str, Any]:
        p = subprocess.run([sys.executable, "-c", code], cwd=self.root, env=self.env, capture_output=True, text=True,
                           timeout=timeout)
        if p.returncode != 0:
            raise SystemExit(f"a baseline process failed:\n{p.stderr}")
        return dict(json.loads(p.stdout.strip().splitlines()[-1]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="1GiB", help="state held by the program (default 1GiB)")
    ap.add_argument("--reps", type=int, default=2, help="baseline and move repetitions (best of each)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    ns = ap.parse_args()
    size = parse_size(ns.size)
    notes = []
    # The move holds two copies (source and destination) plus the capture's and the restore's
    # buffers: about 4x the state at the peak; leave 1 GiB for everything else.
    avail = available()
    if avail and 4 * size + (1 << 30) > avail:
        scaled = max(64 << 20, (avail - (1 << 30)) // 4) & ~((1 << 20) - 1)
        notes.append(f"scaled down from {size / 2**20:.0f} MiB to {scaled / 2**20:.0f} MiB: only "
                     f"{avail / 2**30:.1f} GiB of memory available (a move needs about 4x the state)")
        size = scaled
    root = Path(tempfile.mkdtemp(prefix="sojourn-bench-move-", dir=os.environ.get("BENCH_DIR")))
    e = Env(root)
    # A new seed for every capture: chunks are content-addressed, and a capture of bytes the
    # repository already holds writes nothing.
    state = lambda seed: textwrap.dedent(STATE.format(n=size, seed=seed))  # noqa: E731
    mib = size / 2**20
    print(f"state {mib:.0f} MiB of numpy float64; repository {e.repo} ({os.cpu_count()} CPUs, "
          f"{avail / 2**30:.1f} GiB available, load {os.getloadavg()[0]:.2f})", flush=True)

    # -- baseline: write + read alone -------------------------------------------------------
    caps, rests = [], []
    for rep in range(ns.reps):
        cap = e.py(BASE_CAPTURE.format(src=str(SRC), repo=e.repo, state=state(100 + rep)))
        # The page cache stays warm, as it is for the move's restore right after its capture.
        rest = e.py(BASE_RESTORE.format(src=str(SRC), repo=e.repo, capsule=cap["capsule"]))
        caps.append(cap["seconds"])
        rests.append(rest["seconds"])
        print(f"  baseline: capture {cap['seconds']:.3f} s, restore {rest['seconds']:.3f} s (user {rest['user']:.2f}, "
              f"system {rest['system']:.2f})", flush=True)

    # -- the live move ----------------------------------------------------------------------
    limit = lambda k: f"{max(1, (k * size) >> 20) + 1024}MiB"  # noqa: E731
    e.sojourn("machines", "set", "small", "--memory", limit(3))
    e.sojourn("machines", "set", "big", "--memory", limit(6))
    moves: list[dict[str, Any]] = []
    for rep in range(ns.reps):
        (e.work / "holder.py").write_text(textwrap.dedent(HOLDER.format(state=state(200 + rep))))
        ticks, stop = root / f"ticks-{rep}.txt", root / f"stop-{rep}"
        run = e.sojourn("run", "--on", "small", "--detach", "holder.py", str(ticks), str(stop))
        ws = run.stdout.strip().split()[-1]
        deadline = time.monotonic() + 600
        while not (ticks.exists() and len(ticks.read_text().splitlines()) >= 25):
            if time.monotonic() > deadline:
                raise SystemExit(f"the program did not start: {e.sojourn('show', ws).stdout}")
            time.sleep(0.1)
        t0 = time.monotonic()
        mv = json.loads(e.sojourn("move", ws, "--to", "big", "--json").stdout)
        wall = time.monotonic() - t0
        if not mv.get("moved"):
            raise SystemExit(f"the move failed: {mv}")
        time.sleep(0.5)
        stop.write_text("")
        deadline = time.monotonic() + 600
        while json.loads(e.sojourn("show", ws, "--json").stdout)["state"] == "running":
            if time.monotonic() > deadline:
                raise SystemExit("the program did not stop")
            time.sleep(0.2)
        rec = json.loads(e.sojourn("show", ws, "--json").stdout)
        (ev,) = [x for x in rec["events"] if x["type"] == "move" and not x.get("stale")]
        src_marker = marker(e, ws, str(ev["move"]), "source")
        rows = [ln.split() for ln in ticks.read_text().splitlines()]
        gaps = [(float(b[1]) - float(a[1]), a[2] != b[2]) for a, b in itertools.pairwise(rows)]
        across = [g for g, moved in gaps if moved]
        step = sorted(g for g, _ in gaps)[len(gaps) // 2]
        machines = [a["machine"] for a in rec["allocations"]]
        m: dict[str, Any] = {"paused": float(ev["paused_ms"]) / 1e3, "restore": float(ev["restore_ms"]) / 1e3,
             "capture": float(src_marker.get("seconds_capture") or 0.0),
             "gap": (across[0] - step) if across else float("nan"), "wall": wall,
             "size": int(src_marker.get("size") or 0), "machines": machines,
             # CPU seconds of the destination's restore: system time is the first touch of its
             # memory, which depends on the host (docs/moves.md, "Time")
             "restore_user": float((ev.get("restore") or {}).get("user") or float("nan")),
             "restore_system": float((ev.get("restore") or {}).get("system") or float("nan"))}
        moves.append(m)
        print(f"  move {rep + 1}: paused {m['paused']:.3f} s (capture {m['capture']:.3f} + restore "
              f"{m['restore']:.3f}: user {m['restore_user']:.2f}, system {m['restore_system']:.2f}); step gap {m['gap']:.3f} s; `sojourn move` {wall:.2f} s; {' -> '.join(machines)}",
              flush=True)

    base_w, base_r = min(caps), min(rests)
    base = base_w + base_r
    best = min(moves, key=lambda m: m["paused"])
    overhead = best["paused"] - (best["capture"] + best["restore"])
    ratio = best["paused"] / base
    print()
    print(f"{'live move, ' + f'{mib:.0f} MiB':<44} {'seconds':>9}")
    print("-" * 54)
    for label, v in [("baseline: capture alone (write)", base_w), ("baseline: restore alone (read + check)", base_r),
                     ("baseline: write + read", base),
                     ("move: paused (move event, paused_ms)", best["paused"]),
                     ("move: paused (gap in the step timestamps)", best["gap"]),
                     ("move: capture inside the move", best["capture"]),
                     ("move: restore inside the move", best["restore"]),
                     ("move: protocol = paused - (capture + restore)", overhead),
                     ("`sojourn move` command, end to end", best["wall"])]:
        print(f"{label:<44} {v:>9.3f}")
    print("-" * 54)
    print(f"{'paused / (write + read alone)':<44} {ratio:>8.2f}x   target <= 1.5x: {'ok' if ratio <= 1.5 else 'MISSED'}")
    print(f"{'protocol overhead':<44} {overhead * 1e3:>6.0f} ms   target <= 200 ms: "
          f"{'ok' if overhead <= 0.2 else 'MISSED'}")
    print(f"capsule {best['size'] / 2**20:.0f} MiB; best of {ns.reps}; machines {' -> '.join(best['machines'])}")
    for n in notes:
        print(f"note: {n}")
    if not ns.keep:
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    else:
        print(f"kept {root}")
    return 0 if ratio <= 1.5 and overhead <= 0.2 else 1


def marker(e: Env, ws: str, move: str, part: str) -> dict[str, Any]:
    sys.path.insert(0, str(SRC))
    os.environ["SOJOURN_HOME"] = e.env["SOJOURN_HOME"]
    from sojourn.repository.repo import open_repository
    from sojourn.workspace.migrate import get_marker
    from sojourn.workspace.store import WorkspaceStore

    with open_repository(e.repo) as repo:
        return get_marker(WorkspaceStore(repo), ws, move, part) or {}


if __name__ == "__main__":
    sys.exit(main())
