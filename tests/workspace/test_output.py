"""A workspace's output survives its supervisor being killed at any moment (docs/workspaces.md,
"Logs"): every line once, in order.

The program prints a numbered line every few milliseconds (and every tenth one on stderr
too). The test hook ``supervisor.read-unlogged`` SIGKILLs the supervisor (here the
`sojourn run` command) right after it read output it has not written as a log piece yet,
once it has written at least one piece: the moment whose output used to be lost (up to 2 s
of it). What comes after (the orphaned session's pause, or a reaper when the session is
killed too) must put exactly the rest into the log.
"""

from __future__ import annotations

import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sojourn.workspace import logs
from tests.workspace.conftest import Shell, finish, kill, wait_for
from tests.workspace.test_move import holders_alive

TICKER = """
import sys, time
n = int(sys.argv[1])
for i in range(n):
    with open("steps.txt", "a") as f:
        f.write(f"{i}\\n")
    print(f"line {i}", flush=True)
    if i % 10 == 0:
        print(f"err {i}", file=sys.stderr, flush=True)
    time.sleep(0.004)
print("done", flush=True)
"""
N = 1200
FAULT = "supervisor.read-unlogged"


class Ticker:
    def __init__(self, sh: Shell, tmp_path: Path):
        self.sh = sh
        self.tag = uuid.uuid4().hex  # every process of the test carries it: none is left behind
        sh.env["SOJOURN_TEST_TAG"] = self.tag
        self.home = tmp_path / "home"
        sh.env["SOJOURN_HOME"] = str(self.home)
        self.faults = tmp_path / "faults"
        self.faults.mkdir()
        sh.env["SOJOURN_FAULT_DIR"] = str(self.faults)
        sh.write("ticker.py", TICKER, prelude=False)

    def hit(self, point: str, timeout: float = 60) -> int:
        path = self.faults / f"{point}.hit"
        wait_for(lambda: path.exists() and path.read_text(), timeout, f"fault point {point}")
        return int(path.read_text())

    def steps(self) -> list[int]:
        path = self.sh.dir / "steps.txt"
        return [int(x) for x in path.read_text().split()] if path.exists() else []

    def wait_end(self, ws: str, timeout: float = 90) -> dict[str, Any]:
        def ended() -> dict[str, Any] | None:
            rec = self.sh.show(ws)
            return rec if rec["state"] != "running" else None

        return dict(wait_for(ended, timeout, f"workspace {ws} to stop running"))

    def log(self, ws: str, stream: str) -> list[str]:
        res = self.sh.cli("logs", ws, "--stream", stream)
        assert res.returncode == 0, res.stderr
        return res.stdout.splitlines() if stream == "stdout" else res.stderr.splitlines()

    def leftovers(self) -> list[Path]:
        out = self.home / "output"
        return sorted(out.iterdir()) if out.exists() else []


@pytest.fixture
def tk(sh: Shell, tmp_path: Path) -> Iterator[Ticker]:
    t = Ticker(sh, tmp_path)
    yield t
    sh.kill_all()
    for pid in holders_alive(t.tag):
        kill(pid, signal.SIGKILL)


def test_supervisor_killed_holding_unlogged_output_loses_nothing(tk: Ticker) -> None:
    """The `sojourn run` command dies with output read and not logged; its session pauses as
    an orphan; a resume finishes the program. The log is every line once, in order, on both
    streams, and equal to an unmoved run."""
    run = tk.sh.start("run", "ticker.py", str(N), env={"SOJOURN_FAULT": f"{FAULT}:kill"})
    ws = tk.sh.workspace_of(run)
    code, terminal, _ = finish(run)
    assert code == -signal.SIGKILL, "the supervisor was not killed at the hook"
    assert terminal.startswith("line 0\n"), terminal[:200]  # it had shown (and so read) output
    shown = len(terminal.splitlines())
    rec = tk.wait_end(ws)
    assert rec["state"] == "suspended" and "supervisor" in rec["detail"], rec["detail"]
    assert shown < len(tk.steps()) < N, "the program must have run on after the supervisor died"
    res = tk.sh.cli("resume", ws, timeout=120)
    assert res.returncode == 0, res.stderr
    assert tk.steps() == list(range(N))
    assert tk.log(ws, "stdout") == [f"line {i}" for i in range(N)] + ["done"]
    assert [x for x in tk.log(ws, "stderr") if x.startswith("err ")] == [f"err {i}" for i in range(0, N, 10)]
    assert tk.sh.cli("logs", ws, "--stream", "stdout").stdout == tk.sh.plain("ticker.py", str(N))
    assert tk.leftovers() == []  # the output files of both allocations are gone once logged
    wait_for(lambda: not holders_alive(tk.tag), 30, "every process of the test to end")


def test_supervisor_and_session_killed_the_reaper_logs_the_rest(tk: Ticker) -> None:
    """The supervisor dies with output read and not logged, then its session is killed too
    before it could pause (held at ``session.orphaned`` while the program runs on). The
    reaper that records the allocation as failed puts the rest of the output into the log:
    the lines are 0..k-1 with no hole and none twice, k the steps the program printed."""
    run = tk.sh.start("run", "ticker.py", str(N),
                      env={"SOJOURN_FAULT": f"{FAULT}:kill,session.orphaned:wait"})
    ws = tk.sh.workspace_of(run)
    code, _, _ = finish(run)
    assert code == -signal.SIGKILL
    pid = tk.hit("session.orphaned")
    wait_for(lambda: len(tk.steps()) > 20, 30, "the program to run on")
    kill(pid, signal.SIGKILL)
    rec = tk.wait_end(ws)
    assert rec["state"] == "failed" and "gone" in rec["detail"], rec["detail"]
    steps = tk.steps()
    lines = tk.log(ws, "stdout")
    assert len(lines) in (len(steps) - 1, len(steps)), (len(lines), len(steps))  # killed between write and print
    assert lines == [f"line {i}" for i in range(len(lines))]
    errs = [x for x in tk.log(ws, "stderr") if x.startswith("err ")]
    assert errs == [f"err {i}" for i in range(0, len(lines), 10)][: len(errs)]
    assert len(errs) >= len(range(0, len(lines) - 1, 10))
    assert tk.leftovers() == []
    wait_for(lambda: not holders_alive(tk.tag), 30, "every process of the test to end")


def test_a_machines_supervisor_killed_holding_unlogged_output_loses_nothing(tk: Ticker) -> None:
    """The same moment for the supervisor of an allocation on a machine (a detached process
    that `sojourn run --on` starts): its session pauses as an orphan, a resume on the machine
    finishes the program, and the log equals an unmoved run."""
    p = tk.sh.cli("machines", "set", "small")
    assert p.returncode == 0, p.stderr
    p = tk.sh.cli("run", "--on", "small", "--detach", "ticker.py", str(N), env={"SOJOURN_FAULT": f"{FAULT}:kill"})
    assert p.returncode == 0, p.stderr
    ws = p.stdout.strip()
    supervisor = tk.hit(FAULT)
    rec = tk.wait_end(ws)
    assert rec["state"] == "suspended" and "supervisor" in rec["detail"], rec["detail"]
    assert rec["allocations"][0]["pid"] == supervisor  # the one killed was the allocation's supervisor
    res = tk.sh.cli("resume", ws, timeout=120)
    assert res.returncode == 0, res.stderr
    assert tk.log(ws, "stdout") == [f"line {i}" for i in range(N)] + ["done"]
    assert [x for x in tk.log(ws, "stderr") if x.startswith("err ")] == [f"err {i}" for i in range(0, N, 10)]
    assert tk.leftovers() == []
    wait_for(lambda: not holders_alive(tk.tag), 30, "every process of the test to end")


def test_pieces_record_their_file_offsets_and_the_rest_is_logged_once(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The format, in one process: a piece starts with the offsets it ends at (readers skip
    them; a piece without them reads as before), and :func:`logs.log_rest` appends exactly
    what the files hold beyond the newest piece's offsets, then removes the files."""
    from sojourn.repository.repo import open_repository

    monkeypatch.setenv("SOJOURN_HOME", str(tmp_path / "home"))
    old = logs.encode([("stdout", b"a\n"), ("stderr", b"b\n")])
    assert list(logs.decode(old, "old")) == [("stdout", b"a\n"), ("stderr", b"b\n")]
    assert logs.piece_ends(old, "old") is None
    with open_repository(tmp_path / "repo", create=True) as repo:
        out, err = logs.output_paths("ws_x", "al_y")
        out.parent.mkdir(parents=True)
        out.write_bytes(b"one\ntwo\nthree\n")
        err.write_bytes(b"warn\n")
        w = logs.LogWriter(repo.backend, "ws_x", "al_y", ends=(0, 0))
        w.write("stdout", b"one\n", end=4)  # what a supervisor had logged when it died
        w.flush()
        w.write("stdout", b"two\n", end=8)  # read, never logged: the rest must carry it
        blob = repo.backend.load(logs.KIND, logs.piece_name("ws_x", "al_y", 1))
        assert logs.piece_ends(blob, "p1") == (4, 0) and list(logs.decode(blob, "p1")) == [("stdout", b"one\n")]
        assert logs.log_rest(repo.backend, "ws_x", "al_y") == len(b"two\nthree\nwarn\n")
        assert not out.exists() and not err.exists()
        assert logs.logged_ends(repo.backend, "ws_x", "al_y") == (14, 5)
        got = [(r.stream, r.data) for _, r in logs.allocation_records(repo.backend, "ws_x", "al_y")]
        assert got == [("stdout", b"one\n"), ("stdout", b"two\nthree\n"), ("stderr", b"warn\n")]
        assert logs.log_rest(repo.backend, "ws_x", "al_y") == 0  # the files are gone: nothing twice
