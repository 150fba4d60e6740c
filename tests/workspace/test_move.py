"""`sojourn move WS --to MACHINE`: a live move between real processes (docs/moves.md).

The program appends each step's number to a file and prints it: across the move the output
must equal an unmoved run, and no step may be in the file twice (a statement run twice) or
missing. Every process a test starts (the detached destination included) carries a tag in
its environment, and the fixture kills whatever still carries it at the end.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import interpreters
from tests.workspace.conftest import Shell, finish, wait_for

COUNT = """
import random, sys, time
n = int(sys.argv[1]) if len(sys.argv) > 1 else 40
blob = random.Random(0).randbytes(1 << 20)  # 1 MiB that does not compress, in every capsule
total = 0
for i in range(n):
    total += i
    with open("steps.txt", "a") as f:
        f.write(f"{i}\\n")
    print(i, total, flush=True)
    time.sleep(0.03)
print("done", total, len(blob))
"""


_EXPECTED: dict[int, str] = {}  # the unmoved output, by length (the program is deterministic)


class Mover:
    """A Shell whose processes are tagged, with the checks every move test makes."""

    def __init__(self, sh: Shell, tmp_path: Path, n: int = 150):
        self.sh = sh
        self.n = n
        self.tag = uuid.uuid4().hex
        sh.env["SOJOURN_TEST_TAG"] = self.tag
        sh.env["SOJOURN_HOME"] = str(tmp_path / "home")
        self.faults = tmp_path / "faults"
        self.faults.mkdir()
        sh.env["SOJOURN_FAULT_DIR"] = str(self.faults)
        sh.write("count.py", COUNT, prelude=False)
        self.length(n)

    def length(self, n: int) -> None:
        """The program's number of steps (and its output, unmoved)."""
        self.n = n
        if n not in _EXPECTED:
            _EXPECTED[n] = self.sh.plain("count.py", str(n))
            (self.sh.dir / "steps.txt").unlink()
        self.expected = _EXPECTED[n]

    def start(self, *args: str, fault: str | None = None) -> tuple[subprocess.Popen[str], str]:
        env = {"SOJOURN_FAULT": fault} if fault else None
        run = self.sh.start("run", *args, "count.py", str(self.n), env=env)
        ws = self.sh.workspace_of(run)
        wait_for(lambda: (self.sh.dir / "steps.txt").exists() and len(self.steps()) >= 5, 30, "the program to run")
        return run, ws

    def move(self, ws: str, to: str = "local", fault: str | None = None, *extra: str) -> subprocess.CompletedProcess[str]:
        env = {"SOJOURN_FAULT": fault} if fault else None
        return self.sh.cli("move", ws, "--to", to, *extra, env=env, timeout=180)

    def steps(self) -> list[int]:
        path = self.sh.dir / "steps.txt"
        return [int(x) for x in path.read_text().split()] if path.exists() else []

    def record(self, ws: str) -> dict[str, Any]:
        return self.sh.show(ws)

    def wait_end(self, ws: str, timeout: float = 60) -> dict[str, Any]:
        def ended() -> dict[str, Any] | None:
            rec = self.record(ws)
            return rec if rec["state"] != "running" else None

        return dict(wait_for(ended, timeout, f"workspace {ws} to stop running"))

    def complete(self, ws: str) -> dict[str, Any]:
        """Wait for the workspace to stop; resume it until it finished (a fault may leave it
        suspended or failed on a good capsule)."""
        for _ in range(4):
            rec = self.wait_end(ws)
            if rec["state"] == "finished":
                return rec
            assert rec["next_action"]["action"] == "resume", rec["next_action"]
            res = self.sh.cli("resume", ws, timeout=120)
            assert res.returncode in (0, 75), res.stderr
        raise AssertionError(f"{ws} did not finish")

    def check_final(self, ws: str, terminal: str | None = None) -> dict[str, Any]:
        """The invariants of every case: one program run, as if unmoved. ``terminal``: what the
        killed `sojourn run` had shown (it may have died with up to 2 s of output read but not
        yet logged; docs/workspaces.md, Crashes)."""
        rec = self.complete(ws)
        assert self.steps() == list(range(self.n)), self.steps()  # each statement's effect once, in order
        log = self.sh.cli("logs", ws, "--stream", "stdout").stdout
        if terminal is not None:
            log = stitched(terminal, log)
        assert log == self.expected, (log, self.sh.cli("show", ws).stdout)
        assert not [a for a in rec["allocations"] if a["ended"] is None], rec["allocations"]
        assert holders_alive(self.tag) == [], "a process of this test still runs after the workspace finished"
        return rec

    def hit(self, point: str, timeout: float = 60) -> int:
        path = self.faults / f"{point}.hit"
        wait_for(path.exists, timeout, f"fault point {point}")
        time.sleep(0.02)
        return int(path.read_text() or 0)

    def go(self, point: str) -> None:
        (self.faults / f"{point}.go").write_text("")

    def cleanup(self) -> None:
        for pid in holders_alive(self.tag):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def stitched(terminal: str, log: str) -> str:
    """What the user saw: the terminal's output, then the log from where the terminal ends."""
    tl, ll = terminal.splitlines(True), log.splitlines(True)
    if tl and tl[-1] in ll:
        ll = ll[ll.index(tl[-1]) + 1 :]
    return "".join(tl + ll)


def holders_alive(tag: str) -> list[int]:
    """Processes (not zombies) whose environment carries ``tag``."""
    out = []
    needle = f"SOJOURN_TEST_TAG={tag}".encode()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if needle in (d / "environ").read_bytes().split(b"\0"):
                state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":
                    out.append(int(d.name))
        except OSError:
            continue
    return out


def mover(sh: Shell, tmp_path: Path) -> Iterator[Mover]:
    m = Mover(sh, tmp_path)
    yield m
    sh.kill_all()
    m.cleanup()


@pytest.fixture
def mv(sh: Shell, tmp_path: Path) -> Iterator[Mover]:
    yield from mover(sh, tmp_path)


def moves_of(rec: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in rec["events"] if e["type"] == "move" and not e.get("stale")]


def test_a_live_move_to_another_python_is_one_run(mv: Mover) -> None:
    """Moved live to another interpreter: the output equals an unmoved run, no step twice,
    the source stopped as `moved`, the destination resumed from the move's capsule."""
    py = interpreters().get("3.12") or interpreters().get("3.13") or interpreters()["3.11"]
    run, ws = mv.start()
    res = mv.move(ws, py)
    assert res.returncode == 0, res.stderr
    assert "moved to al_" in res.stderr and "paused" in res.stderr, res.stderr
    code, out, err = finish(run)
    assert code == 78, err  # the `sojourn run` in front: its program carries on elsewhere
    rec = mv.check_final(ws)
    src, dst = rec["allocations"]
    assert src["stop_reason"] == "moved" and dst["stop_reason"] == "finished"
    cap = rec["capsules"][0]
    assert cap["verified"] and cap["reason"] == "move" and dst["capsule_in"] == cap["id"] == src["capsule_out"]
    assert (dst["python"] == py and dst["python_version"] != src["python_version"]) or py == src["python"]
    (m,) = moves_of(rec)
    assert m["outcome"] == "moved" and m["paused_ms"] is not None and 0 < m["paused_ms"] < 5000
    assert out.strip() and mv.sh.cli("logs", ws, "--stream", "stdout").stdout.startswith(out)
    assert rec["epoch"] == 2 and rec["holder"] == dst["id"]


def test_moved_twice_then_suspended_and_resumed(mv: Mover) -> None:
    """The destination is a full supervisor: it serves a second move and a suspend."""
    mv.length(300)
    run, ws = mv.start("--name", "twice")
    assert mv.move(ws).returncode == 0
    wait_for(lambda: len(mv.steps()) >= 15, 30, "more steps")
    second = mv.move("twice")
    assert second.returncode == 0, second.stderr
    wait_for(lambda: len(mv.steps()) >= 22, 30, "more steps")
    sus = mv.sh.cli("suspend", ws)
    assert sus.returncode == 0, sus.stderr
    rec = mv.check_final(ws)
    assert [a["stop_reason"] for a in rec["allocations"]] == ["moved", "moved", "suspended", "finished"]
    assert [m["outcome"] for m in moves_of(rec)] == ["moved", "moved"]
    finish(run)


def test_a_refused_pause_leaves_the_program_running(mv: Mover) -> None:
    mv.sh.write("thread.py", """
import threading, time
ev = threading.Event()
t = threading.Thread(target=ev.wait)
t.start()
for i in range(30):
    with open("steps.txt", "a") as f:
        f.write(f"{i}\\n")
    print(i, flush=True)
    time.sleep(0.03)
ev.set()
""", prelude=False)
    run = mv.sh.start("run", "thread.py")
    ws = mv.sh.workspace_of(run)
    wait_for(lambda: len(mv.steps()) >= 3, 30, "the program to run")
    res = mv.move(ws)
    assert res.returncode == 1 and "refused" in res.stderr and "keeps running" in res.stderr, res.stderr
    code, _, _ = finish(run)
    assert code == 0 and mv.steps() == list(range(30))
    rec = mv.record(ws)
    assert rec["state"] == "finished" and len(rec["allocations"]) == 1
    assert [m["outcome"] for m in moves_of(rec)] == ["refused"]


def test_move_of_a_workspace_that_is_not_running(mv: Mover) -> None:
    run, ws = mv.start()
    assert mv.sh.cli("suspend", ws).returncode == 0
    finish(run)
    res = mv.move(ws)
    assert res.returncode == 2 and "is not running (suspended)" in res.stderr and "sojourn resume" in res.stderr


def test_move_json(mv: Mover) -> None:
    run, ws = mv.start()
    res = mv.move(ws, "local", None, "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["moved"] and doc["workspace"] == ws and doc["capsule"].startswith("cap_")
    finish(run)
    mv.check_final(ws)
