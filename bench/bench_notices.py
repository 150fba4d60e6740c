"""Notice -> capsule durable: how long a preempted session takes to be safe.

    python bench/bench_notices.py [--rounds N] [--mib M] [--poll S]

Each round starts a real ``sojourn run`` of a small numpy script (holding ``--mib`` MiB of
arrays) with the AWS watcher pointed at a local IMDSv2 server (tests/notices/metadata_server.py,
the real protocol and payloads), flips the server to return a spot ``instance-action``, and
times, from the flip:

* ``seen``: the supervisor's ``request`` event (the notice was read and the pause asked for);
* ``durable``: the workspace's ``capsule`` event with a verified capsule (written, checked in a
  fresh interpreter, recorded): from here a resume elsewhere works;
* ``exited``: the ``sojourn run`` process has ended (stop reason ``preempted``).

``--poll`` is the watcher's interval (AWS asks for 5 s; the expected wait for the next poll
is half of it, which the table also shows as ``durable + poll/2 at 5 s``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.notices.metadata_server import MetadataServer  # noqa: E402

SCRIPT = """
import time
import numpy as np
rng = np.random.default_rng(0)
state = rng.standard_normal(({n},))
i = 0
while True:
    state *= 0.999
    i += 1
    if i % 10 == 0:
        print(i, float(state[:4].sum()), flush=True)
    time.sleep(0.01)
"""


def one_round(work: Path, mib: int, poll: float) -> dict[str, float]:
    srv = MetadataServer().start()
    repo = work / "repo"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), SOJOURN_REPO=str(repo), SOJOURN_HOME=str(work / "home"),
               SOJOURN_CACHE=str(work / "cache"), SOJOURN_NOTICES="aws", SOJOURN_IMDS_ENDPOINT=srv.url,
               SOJOURN_NOTICE_POLL_S=str(poll))
    (work / "job.py").write_text(textwrap.dedent(SCRIPT.format(n=mib * 2**20 // 8)))
    cmd = [sys.executable, "-m", "sojourn.cli.main"]
    proc = subprocess.Popen([*cmd, "run", "job.py"], cwd=work, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        for _ in range(3):
            if not proc.stdout.readline():
                raise RuntimeError(f"the run ended early: {proc.communicate()[1]}")
        srv.aws_notice("terminate", 120)
        t_flip = srv.flipped_at or time.time()
        _out, err = proc.communicate(timeout=300)
        t_exit = time.time()
        if proc.returncode != 75:
            raise RuntimeError(f"sojourn run exited {proc.returncode}, not 75 (paused): {err[-2000:]}")
        rows = json.loads(subprocess.run([*cmd, "ps", "--json"], cwd=work, env=env, capture_output=True,
                                         text=True, check=True).stdout)
        ws = rows[0]["id"]
        rec = json.loads(subprocess.run([*cmd, "show", ws, "--json"], cwd=work, env=env, capture_output=True,
                                        text=True, check=True).stdout)
        assert rec["allocations"][-1]["stop_reason"] == "preempted", rec["detail"]
        ev = rec["events"]
        req = next(e for e in ev if e["type"] == "request" and e.get("kind") == "preempted")
        cap = next(e for e in ev if e["type"] == "capsule" and e["capsule"]["verified"])
        return {"seen": req["t"] - t_flip, "durable": cap["t"] - t_flip, "exited": t_exit - t_flip,
                "size_mib": cap["capsule"]["size"] / 2**20}
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        srv.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--mib", type=int, default=64, help="MiB of numpy state the script holds")
    ap.add_argument("--poll", type=float, default=0.1, help="watcher poll interval in seconds")
    ns = ap.parse_args()
    results = []
    for r in range(ns.rounds):
        with tempfile.TemporaryDirectory(prefix="sj-bench-notices-") as d:
            results.append(one_round(Path(d), ns.mib, ns.poll))
        print(f"round {r + 1}: " + ", ".join(f"{k} {v:.3f}" for k, v in results[-1].items()), file=sys.stderr)
    print(f"\nnotice -> capsule durable (AWS instance-action via local IMDSv2, poll {ns.poll:g} s, "
          f"{ns.mib} MiB numpy state, capsule {results[0]['size_mib']:.1f} MiB, {ns.rounds} rounds)")
    print(f"{'':10}{'min':>9}{'median':>9}{'max':>9}")
    for key in ("seen", "durable", "exited"):
        vals = [x[key] for x in results]
        print(f"{key:10}{min(vals):8.3f}s{statistics.median(vals):8.3f}s{max(vals):8.3f}s")
    med = statistics.median(x["durable"] for x in results)
    print(f"durable + poll/2 at AWS's 5 s poll: {med - ns.poll / 2 + 2.5:.3f}s (of the 120 s an AWS notice gives)")


if __name__ == "__main__":
    main()
