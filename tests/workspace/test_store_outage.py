"""The supervisor survives a repository that does not answer for a while (issue 12).

The repository is moved away (an unmounted share, S3 unreachable: every write fails) while
the program runs, and a pause is asked of the session directly (SIGUSR1, as a notice would)
and refused (a live thread): the supervisor's output pump used to die writing the `refused`
event, console output stopped, and the capsule the session later wrote was never read, so
the workspace ended `failed` with nothing to resume. Now the pump keeps the event and goes
on; once the repository is back, the event, the capsule and the stop are all recorded."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.workspace.conftest import Shell, finish, wait_for

THREADED = """
import threading, time
worker = threading.Thread(target=time.sleep, args=(2.0,), name="feeder")
worker.start()
for i in range(600):
    print(i, flush=True)
    time.sleep(0.02)
    if i == 10:
        worker.join()
        del worker  # (a finished Thread object does not travel either)
"""


@pytest.mark.slow
def test_the_output_pump_survives_an_outage_and_the_capsule_is_recorded(sh: Shell) -> None:
    sh.write("threaded.py", THREADED)
    run = sh.start("run", "threaded.py")
    ws = sh.workspace_of(run)
    sh.read_lines(run, 3)
    session = wait_for(lambda: (sh.show(ws)["allocations"][-1].get("session_pid")), 30, "the session's pid")
    repo = Path(sh.repo)
    away = repo.with_name("repo.away")
    repo.rename(away)
    try:
        os.kill(int(session), signal.SIGUSR1)  # a pause the live thread refuses
        time.sleep(0.5)
        more = sh.read_lines(run, 20)  # console output goes on through the outage
        assert len(more) == 20
    finally:
        away.rename(repo)
    time.sleep(2.5)  # the thread is gone now: the next pause lands
    sus = sh.cli("suspend", ws)
    assert sus.returncode == 0, sus.stderr
    code, _, err = finish(run)
    assert code == 75, err
    assert "Exception in thread" not in err, err
    rec = sh.show(ws)
    assert rec["state"] == "suspended" and rec["last_capsule"]["verified"], rec["detail"]
    assert [e["type"] for e in rec["events"]].count("refused") == 1
