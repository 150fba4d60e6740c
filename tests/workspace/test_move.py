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
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import interpreters, needs_python
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

    def check_final(self, ws: str) -> dict[str, Any]:
        """The invariants of every case: one program run, as if unmoved; its log alone equals
        the unmoved output, whichever process was killed (docs/workspaces.md, Logs)."""
        rec = self.complete(ws)
        assert self.steps() == list(range(self.n)), self.steps()  # each statement's effect once, in order
        log = self.sh.cli("logs", ws, "--stream", "stdout").stdout
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
for i in range(150):
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
    assert code == 0 and mv.steps() == list(range(150))
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


# -- moves between machines: the destination launched by the machine's provider -------------


def machines_set(sh: Shell, *args: str) -> None:
    p = sh.cli("machines", "set", *args)
    assert p.returncode == 0, p.stderr


def scratch_steps(a: dict[str, Any]) -> list[int]:
    path = Path(a["scratch"]) / "steps.txt"
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def wait_output(sh: Shell, ws: str, lines: int) -> None:
    wait_for(lambda: sh.cli("logs", ws, "--stream", "stdout").stdout.count("\n") >= lines, 60, f"{lines} lines")


def test_move_between_machines_through_the_provider(mv: Mover) -> None:
    """`run --on small --detach`, then `move --to big`: the destination is launched by the
    local provider in big's scratch directory, with the files the program wrote on small
    (from the move's capsule), under big's limits; the allocation names provider, machine,
    offer, scratch, hard stop and handle like `run --on`; each allocation has its spend."""
    sh = mv.sh
    machines_set(sh, "small", "--memory", "300MiB", "--cpus", "1", "--price", "0.10")
    machines_set(sh, "big", "--memory", "16GiB", "--price", "3600", "--max-duration", "1h")
    p = sh.cli("run", "--on", "small", "--detach", "count.py", str(mv.n))
    assert p.returncode == 0, p.stderr
    ws = p.stdout.strip()
    small = sh.show(ws)["allocations"][0]
    wait_for(lambda: len(scratch_steps(small)) >= 5, 30, "the program to run on small")
    res = mv.move(ws, "big")
    assert res.returncode == 0, res.stderr
    assert "starting on local:big in " in res.stderr and "moved to al_" in res.stderr, res.stderr
    follow = sh.cli("logs", "-f", ws, "--stream", "stdout")
    assert follow.stdout == mv.expected
    rec = mv.wait_end(ws)
    a, b = rec["allocations"]
    assert (a["machine"], a["stop_reason"], b["machine"], b["stop_reason"]) == ("small", "moved", "big", "finished")
    assert a["memory_limit"] == 300 << 20 and b["memory_limit"] == 16 << 30
    scratch = Path(sh.env["SOJOURN_HOME"]) / "machines"
    assert Path(b["scratch"]) == scratch / "big" / b["id"] and Path(a["scratch"]) == scratch / "small" / a["id"]
    assert b["provider"] == "local" and b["offer"]["price_per_hour"] == 3600 and b["offer"]["name"] == "big"
    assert b["handle"]["provider"] == "local" and b["handle"]["data"]["pid"] == b["pid"]
    assert b["handle"]["data"]["scratch"] == b["scratch"]
    assert b["hard_stop"] == pytest.approx(b["started"] + 3600, abs=0.01)
    # Each step's effect once: the file the program wrote on small came along in the capsule.
    assert scratch_steps(b) == list(range(mv.n)), scratch_steps(b)
    assert 0 < len(scratch_steps(a)) < mv.n
    assert (Path(b["scratch"]) / "count.py").exists()
    assert b["capsule_in"] == a["capsule_out"] == rec["capsules"][0]["id"]
    assert rec["files"]["allocation"] == b["id"]
    # Spend: price x wall time, the source's up to the commit (3600 $/h = 1 $/s on big).
    assert 0 < a["spend"] < 0.10 * (a["ended"] - a["started"]) / 3600 + 1e-6
    assert 0.5 * (b["ended"] - b["started"]) < b["spend"] < (b["ended"] - b["started"]) + 0.5
    (m,) = moves_of(rec)
    assert m["outcome"] == "moved" and m["machine"] == "big" and m["paused_ms"] is not None
    shown = sh.cli("show", ws).stdout
    for text in ("local:small", "local:big", "moved", "finished", f"move {m['move']} moved"):
        assert text in shown, shown
    assert holders_alive(mv.tag) == []


def test_readme_demo_small_to_big_on_two_interpreters(mv: Mover, tmp_path: Path) -> None:
    """The README's path, on two different Pythons: machines set, run --on small --detach
    examples/train.py, move --to big, show."""
    py_small, py_big = needs_python("3.12"), needs_python("3.13")
    sh = mv.sh
    machines_set(sh, "small", "--memory", "2GiB", "--cpus", "1", "--python", py_small, "--price", "0.10")
    machines_set(sh, "big", "--memory", "16GiB", "--python", py_big, "--price", "0.80")
    # The README's script, held in its second epoch until the move has been asked for: under
    # load its 8 epochs (~4 s) can end before the destination has started (the move then
    # rightly reports "the source stopped first"). The output is the script's own.
    gate = tmp_path / "go"
    train = (Path(__file__).parents[2] / "examples" / "train.py").read_text()
    held = "            time.sleep(0.01)  # stands for real work"
    assert held in train
    train = train.replace("import time\n", "import os\nimport time\n", 1).replace(
        held, f"            while epoch == 1 and b == 20 and not os.path.exists({str(gate)!r}):\n"
              f"                time.sleep(0.02)\n{held}")
    (sh.dir / "examples").mkdir()
    (sh.dir / "examples" / "train.py").write_text(train)
    gate.touch()
    expected = sh.plain("examples/train.py", "8").splitlines()
    gate.unlink()
    p = sh.cli("run", "--on", "small", "--detach", "examples/train.py", "8")
    assert p.returncode == 0, p.stderr
    ws = p.stdout.strip()
    wait_output(sh, ws, 3)
    threading.Timer(3.0, gate.touch).start()  # after the move's request; a pause lands in the wait too
    res = mv.move(ws, "big")
    gate.touch()
    assert res.returncode == 0, res.stderr
    out = sh.cli("logs", "-f", ws, "--stream", "stdout").stdout.splitlines()
    # Each batch line once, in order (the numbers may differ in the last digits between numpy builds).
    assert [ln.split(" loss")[0] for ln in out] == [ln.split(" loss")[0] for ln in expected], out
    assert out[-1].startswith("accuracy ")
    rec = mv.wait_end(ws)
    a, b = rec["allocations"]
    assert (a["machine"], a["stop_reason"], b["machine"], b["stop_reason"]) == ("small", "moved", "big", "finished")
    assert a["python_version"].startswith("3.12") and b["python_version"].startswith("3.13")
    assert a["spend"] > 0 and b["spend"] > 0
    shown = sh.cli("show", ws).stdout
    for text in ("local:small", "local:big", "moved", "finished", "move mv_", "$0.0"):
        assert text in shown, shown


def test_a_workspace_not_on_a_machine_moves_to_one_with_a_snapshot_of_its_directory(mv: Mover) -> None:
    machines_set(mv.sh, "big", "--price", "0.80")
    run, ws = mv.start()
    res = mv.move(ws, "big")
    assert res.returncode == 0, res.stderr
    code, _, _ = finish(run)
    assert code == 78
    rec = mv.wait_end(ws)
    b = rec["allocations"][1]
    assert b["machine"] == "big" and b["scratch"] and (Path(b["scratch"]) / "count.py").exists()
    assert mv.sh.cli("logs", ws, "--stream", "stdout").stdout == mv.expected
    assert any(e["type"] == "files" and e["allocation"] == b["id"] for e in rec["events"])


def test_a_machine_with_a_missing_interpreter_is_refused_before_anything_runs(mv: Mover) -> None:
    machines_set(mv.sh, "ghost", "--python", "/no/such/python3.99")
    run, ws = mv.start()
    res = mv.move(ws, "ghost")
    assert res.returncode == 2 and "no Python interpreter '/no/such/python3.99'" in res.stderr, res.stderr
    assert mv.record(ws)["state"] == "running"
    assert mv.sh.cli("suspend", ws).returncode == 0
    finish(run)


# -- the holes: signals during a hold, the abort's message, a destination dead before go ----


def test_sigterm_during_the_hold_of_an_aborted_move_pauses_the_program(mv: Mover) -> None:
    """SIGTERM reaches the source while its session is held; the destination then dies: the
    program pauses as SIGTERM asked (suspended on the move's capsule, checked), not carries on."""
    run, ws = mv.start(fault="move.session.held:wait")
    cli = mv.sh.start("move", ws, "--to", "local", env={"SOJOURN_FAULT": "move.dest.after-capsule-seen:kill"})
    mv.hit("move.session.held")
    os.kill(run.pid, signal.SIGTERM)  # the `sojourn run` in front forwards it to the session
    time.sleep(0.3)
    mv.go("move.session.held")
    code, _, err = finish(run)
    assert code == 75, err
    assert "aborted" in err and "pausing as SIGTERM asked" in err, err
    finish(cli)
    rec = mv.record(ws)
    assert rec["state"] == "suspended" and rec["stop_reason"] == "suspended", rec["detail"]
    assert "SIGTERM" in rec["detail"] and rec["last_capsule"]["verified"]
    assert [m["outcome"] for m in moves_of(rec)] == ["aborted"]
    assert rec["last_capsule"]["id"] == moves_of(rec)[0]["capsule"]
    mv.check_final(ws)


def test_an_aborted_move_says_so_and_the_program_continues(mv: Mover) -> None:
    run, ws = mv.start()
    res = mv.move(ws, "local", "move.dest.after-restore:kill")
    assert res.returncode == 1 and "not moved" in res.stderr, res.stderr
    code, _, err = finish(run)
    assert code == 0
    assert "aborted: the destination" in err and "the program continues here" in err, err
    assert "checkpoint cap_" not in err, err
    assert "the program continues here" in mv.sh.cli("logs", ws, "--stream", "stderr").stderr
    mv.check_final(ws)


def test_destination_dead_after_its_events_before_go_leaves_it_suspended(mv: Mover) -> None:
    """Committed but never ran there: suspended on the move's capsule (not failed)."""
    run, ws = mv.start()
    mv.move(ws, "local", "move.dest.after-events:kill")
    finish(run)
    rec = mv.wait_end(ws)
    a, b = rec["allocations"]
    assert rec["state"] == "suspended", (rec["state"], rec["detail"])
    assert a["stop_reason"] == "moved" and b["stop_reason"] == "failed" and "before the program ran" in b["detail"]
    assert rec["last_capsule"]["id"] == b["capsule_in"] and rec["last_capsule"]["reason"] == "move"
    mv.check_final(ws)


def test_a_remote_destinations_timeout_says_what_it_waited_for() -> None:
    from sojourn.workspace.migrate import timeout_reason

    why = timeout_reason({"host": "elsewhere", "pid": 7, "machine": "gpu"}, 130)
    assert "gpu (elsewhere, supervisor pid 7)" in why and "130 s" in why and "another host" in why
    assert "--timeout" in why
    assert "never said it was ready" in timeout_reason(None, 5)


# -- checkpoints on request, fork --now -----------------------------------------------------


# Halfway, the program waits (with pause checks) for the test's `release` file: the
# checkpoint and the fork are taken while it runs, however long they take on a loaded machine.
TICKS = """
import os, time
total = 0
for i in range(120):
    total += i
    print(i, total, flush=True)
    while i == 60 and not os.path.exists("release"):
        time.sleep(0.01)
    time.sleep(0.01)
print("done", total)
"""


def test_checkpoint_and_fork_now_while_the_program_runs(mv: Mover) -> None:
    sh = mv.sh
    sh.write("ticks.py", TICKS, prelude=False)
    release = sh.dir / "release"
    release.write_text("")
    expected = sh.plain("ticks.py")
    release.unlink()
    run = sh.start("run", "ticks.py")
    ws = sh.workspace_of(run)
    wait_output(sh, ws, 5)
    cp = sh.cli("checkpoint", ws)
    assert cp.returncode == 0, cp.stderr
    cap = cp.stdout.strip()
    assert cap.startswith("cap_") and "keeps running" in cp.stderr
    rec = sh.show(ws)
    assert rec["state"] == "running" and rec["pending"] is None
    assert rec["last_capsule"]["id"] == cap and rec["last_capsule"]["verified"]
    fk = sh.cli("fork", ws, "--now", "--name", "branch", "--json")
    assert fk.returncode == 0, fk.stderr
    doc = json.loads(fk.stdout)
    assert doc["capsule"] != cap and doc["name"] == "branch"
    release.write_text("")
    code, out, _ = finish(run)
    assert code == 0 and out == expected  # the source never stopped
    res = sh.cli("resume", "branch")
    assert res.returncode == 0, res.stderr
    assert res.stdout and expected.endswith(res.stdout) and len(res.stdout) < len(expected)
    assert sh.show(ws)["state"] == "finished"
    refused = sh.cli("checkpoint", ws)
    assert refused.returncode == 2 and "is not running (finished)" in refused.stderr
