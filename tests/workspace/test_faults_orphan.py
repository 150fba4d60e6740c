"""A source whose supervisor died while serving a move, and a program that ends before its
orphaned session could pause it (docs/moves.md, "Crashes"; docs/workspaces.md, "Sessions").

Found by the fault campaign (seed 844007807, trial 135: ``move.cli.after-launch:kill`` with
``move.source.after-request:exit``), replayed here deterministically with the test hook
``session.orphaned`` (a ``wait`` there holds the session's control thread, the one that asks
for the orphan's pause, while the program runs on to its end).
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.workspace.conftest import Shell, finish, kill, wait_for
from tests.workspace.test_move import Mover, holders_alive, mover

GATED = """
import os, sys, time
n, gate = int(sys.argv[1]), int(sys.argv[2])
total = 0
for i in range(n):
    while i >= gate and not os.path.exists("open"):  # the test opens it at the step it wants
        time.sleep(0.01)
    total += i
    with open("steps.txt", "a") as f:
        f.write(f"{i}\\n")
    print(i, total, flush=True)
    time.sleep(0.01)
print("done", total)
"""
N, GATE = 30, 10


@pytest.fixture
def mv(sh: Shell, tmp_path: Path) -> Iterator[Mover]:
    sh.write("gated.py", GATED, prelude=False)
    yield from mover(sh, tmp_path)


def expected_output() -> str:
    total, out = 0, []
    for i in range(N):
        total += i
        out.append(f"{i} {total}\n")
    return "".join(out) + f"done {total}\n"


def start_gated(mv: Mover, fault: str) -> tuple[subprocess.Popen[str], str]:
    run = mv.sh.start("run", "gated.py", str(N), str(GATE), env={"SOJOURN_FAULT": fault})
    ws = mv.sh.workspace_of(run)
    wait_for(lambda: len(mv.steps()) >= GATE, 60, "the program to reach its gate")
    return run, ws


def test_a_program_that_ends_while_its_session_is_orphaned_records_its_end(mv: Mover) -> None:
    """The move's command is killed right after it launched the destination; the destination
    asks for the pause; the source supervisor exits right after it took the request. The
    session sees its control pipe end and would pause as an orphan, but the program reaches
    its end first (here: the control thread is held at ``session.orphaned`` while the gate
    opens). Its exit could not be reported to anyone: it used to end with no event at all,
    then a reaper found both processes gone and recorded the workspace ``failed`` with no
    capsule. The session now records its own end: ``finished``."""
    run, ws = start_gated(mv, "move.source.after-request:exit,session.orphaned:wait")
    cli = mv.sh.start("move", ws, "--to", "local", env={"SOJOURN_FAULT": "move.cli.after-launch:kill"})
    mv.hit("move.source.after-request")  # the source supervisor took the request and exited
    mv.hit("session.orphaned")  # its session knows, and is held before it asks for the pause
    (mv.sh.dir / "open").write_text("")  # the program runs on to its end meanwhile
    code, _, err = finish(cli)
    assert code == -9, err  # the command died at move.cli.after-launch
    rec = mv.wait_end(ws)
    assert rec["state"] == "finished", (rec["state"], rec["detail"])
    (a,) = rec["allocations"]
    assert a["stop_reason"] == "finished" and "supervisor" in a["detail"], a
    assert mv.steps() == list(range(N))
    finish(run)
    assert mv.sh.cli("logs", ws, "--stream", "stdout").stdout == expected_output()  # all of it, the log alone
    wait_for(lambda: not holders_alive(mv.tag), 30, "every process of the test to end")
    # The destination gave up on its own (the source stopped before it paused): nothing of
    # it is in the record, and a later resume is not possible nor needed.
    assert [e for e in rec["events"] if e["type"] == "move" and not e.get("stale")] == []


def test_a_program_that_fails_while_orphaned_records_the_failure(mv: Mover) -> None:
    """The same window, and the program raises: its session records ``failed`` with the
    error (not a reaper's "processes gone"), standing on the last good capsule (none)."""
    mv.sh.write("gated.py", GATED.replace('print("done", total)', 'raise ValueError("boom")'), prelude=False)
    run, ws = start_gated(mv, "move.source.after-request:exit,session.orphaned:wait")
    cli = mv.sh.start("move", ws, "--to", "local")
    mv.hit("session.orphaned")
    t0 = time.monotonic()
    (mv.sh.dir / "open").write_text("")
    finish(cli)
    rec = mv.wait_end(ws)
    assert rec["state"] == "failed" and "ValueError: boom" in rec["detail"], rec["detail"]
    assert "supervisor" in rec["detail"] and time.monotonic() - t0 < 60
    assert "ValueError: boom" in mv.sh.cli("logs", ws).stderr  # the orphan logged the rest of its output
    finish(run)
    wait_for(lambda: not holders_alive(mv.tag), 30, "every process of the test to end")


def test_a_destination_that_dies_right_after_its_go_leaves_the_program_run_once(mv: Mover) -> None:
    """Found by tests/workspace/test_faults.py (``move.dest.after-go:kill``, now and then): the
    destination's session reads the go, then the end of its control pipe. It chose between
    "the program never ran here" (record the allocation's end on the move's capsule, exit) and
    "an orphan: pause" by whether its main thread had acted on the go yet; the main thread
    could then run the program's first statements while the control thread recorded the
    workspace suspended on the move's capsule, so those statements ran again on the next
    resume. The choice is now made by whether the go arrived. Replayed with the main thread
    held just after the go (``session.incoming-go``) until the control thread has chosen (held
    at ``session.settle-unstarted``, the old choice, or ``session.orphaned``, the right one),
    then the program running a few steps before that choice is carried out."""
    mv.length(60)
    run, ws = mv.start()
    points = ("session.incoming-go", "session.settle-unstarted", "session.orphaned")
    cli = mv.sh.start("move", ws, "--to", "local",
                      env={"SOJOURN_FAULT": ",".join(["move.dest.after-go:kill"] + [f"{p}:wait" for p in points])})
    mv.hit("session.incoming-go")  # the destination's supervisor sent the go (and dies)
    chose = wait_for(lambda: [p for p in points[1:] if (mv.faults / f"{p}.hit").exists()], 60,
                     "the destination's session to see its supervisor gone")
    moved_at = len(mv.steps())
    mv.go("session.incoming-go")
    wait_for(lambda: len(mv.steps()) >= moved_at + 2, 30, "the program to run on at the destination")
    for p in points[1:]:
        mv.go(p)
    finish(cli)
    finish(run)
    final = mv.check_final(ws)  # every step once, in order
    assert chose == ["session.orphaned"]
    assert [a["stop_reason"] for a in final["allocations"]][:2] == ["moved", "suspended"], final["allocations"]


def test_a_command_killed_before_its_session_said_it_started_is_not_reaped(mv: Mover) -> None:
    """Found by the fault campaign (seeds 925006567 trial 16, 776224386 trial 38: `kill -9` of
    `sojourn resume` a moment after it started): the supervisor records its session's pid
    once the session says it started; killed before that, it left a live session that the
    record did not name. A reaper (any `sojourn show`) found the supervisor gone and no
    session to check, took the next epoch and recorded `failed`, while the orphaned session
    ran a statement, paused and recorded its capsule under the old, now void, epoch: the next
    resume ran that statement again. The reaper now looks for the allocation's session by its
    command line, and the orphan records its own `started` event."""
    run = mv.sh.start("run", "count.py", "30", env={"SOJOURN_FAULT": "session.before-started:wait"})
    ws = mv.sh.workspace_of(run)
    session = mv.hit("session.before-started")
    kill(run.pid, signal.SIGKILL)  # the `sojourn run` command: the supervisor
    finish(run)
    rec = mv.record(ws)  # `show` reaps a holder whose processes are all gone
    assert rec["state"] == "running", (rec["state"], rec["detail"])
    mv.go("session.before-started")
    rec = mv.wait_end(ws)
    assert rec["state"] == "suspended" and "paused by itself" in rec["detail"], (rec["state"], rec["detail"])
    assert rec["allocations"][0]["session_pid"] == session
    res = mv.sh.cli("resume", ws)
    assert res.returncode == 0, res.stderr
    assert mv.steps() == list(range(30))  # every step once: the resume started where the orphan paused
    wait_for(lambda: not holders_alive(mv.tag), 30, "every process of the test to end")
