"""The authority (locks/epoch.*) and pause requests are signed (docs/threat-model.md).

A writer without the key used to stop a running program for good: a planted
``epoch.<ws>.<n+1>`` made its supervisor find the workspace "taken over" and SIGKILL it (the
work since its last capsule lost), and a planted request paused it. Both are now ignored
with a line that names the object; a resume that meets the planted epoch refuses with what
to remove, and runs once it is gone."""

from __future__ import annotations

import json
import time
from pathlib import Path

from tests.workspace.conftest import Shell, finish

COUNT = """
import time
for i in range(400):
    print(i, flush=True)
    time.sleep(0.02)
print("done")
"""


def test_a_planted_epoch_and_request_stop_nothing(sh: Shell) -> None:
    sh.write("count.py", COUNT, prelude=False)
    run = sh.start("run", "count.py")
    ws = sh.workspace_of(run)
    sh.read_lines(run, 3)
    rec = sh.show(ws)
    epoch = rec["epoch"]
    locks, wsdir = Path(sh.repo) / "locks", Path(sh.repo) / "workspaces"
    planted = locks / f"epoch.{ws}.{epoch + 1:06d}"
    planted.write_text(json.dumps({"workspace": ws, "epoch": epoch + 1, "holder": "attacker", "t": time.time()}))
    (wsdir / f"request.{ws}.{epoch}.0001").write_text(json.dumps({"kind": "suspend", "n": 1, "t": time.time()}))
    time.sleep(3.5)  # the supervisor checks its authority every 2 s and polls requests
    more = sh.read_lines(run, 30)
    assert len(more) == 30 and run.poll() is None, "the planted objects stopped the program"
    blocked = sh.cli("suspend", ws)
    assert blocked.returncode == 0, blocked.stderr  # the genuine request (number 2) is served
    code, _, err = finish(run)
    assert code == 75, err
    assert "ignored locks/" in err and "ignored request 1" in err, err
    refused = sh.cli("resume", ws)
    assert refused.returncode != 0 and f"locks/epoch.{ws}" in refused.stderr and "Remove that object" in refused.stderr
    planted.unlink()
    res = sh.cli("resume", ws)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().endswith("done")
