"""No pause ever ends a job: a capsule that fails its write check is refused like any pause
(the check runs in the session while the program waits at its statement boundary), `sojourn
suspend` says which variable and why in one line, and the program carries on; Ctrl-C in a
terminal suspends; a signal during start-up is a pause request, not a kill.

Real processes, real signals, a real pty; every capsule is checked in a fresh interpreter."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.workspace.conftest import Shell, finish, kill, wait_for

# `cache` holds an object whose __setstate__ marks it as loaded: restored in a fresh
# interpreter, it is not what was captured (fingerprint mismatch), so its capsule fails the
# write check. The program waits for the test's `release` file, then ends.
HELD = """
import os, time
class Loaded:
    def __init__(self, n):
        self.n = n
    def __setstate__(self, state):
        self.__dict__.update(state)
        self.loaded = True
cache = {"a": Loaded(3)}
total = 0
print("waiting", flush=True)
while not os.path.exists("release"):
    total += 1
    time.sleep(0.01)
print("released", cache["a"].n, flush=True)
"""


def test_a_capsule_that_fails_its_write_check_is_refused_and_the_program_keeps_running(sh: Shell) -> None:
    sh.write("held.py", HELD, prelude=False)
    run = sh.start("run", "held.py")
    ws = sh.workspace_of(run)
    assert sh.read_lines(run, 1) == ["waiting\n"]
    sus = sh.cli("suspend", ws)
    assert sus.returncode == 1, sus.stderr
    first = sus.stderr.strip().splitlines()[0]
    assert "pause refused; the program keeps running" in first and "write check" in first, sus.stderr
    assert "'cache'" in first and "fingerprint mismatch" in first, sus.stderr
    rec = sh.show(ws)
    assert rec["state"] == "running" and rec["refusals"] == 1
    failed = [c for c in rec["capsules"] if not c["verified"]]
    assert len(failed) == 1 and "cache" in failed[0]["error"] and rec["last_capsule"] is None
    # A SIGTERM (a machine going away) gets the same answer: the program is not killed.
    kill(sh.session_pid(ws), signal.SIGTERM)
    wait_for(lambda: sh.show(ws)["refusals"] == 2, 60, "the second refusal")
    assert run.poll() is None
    (sh.dir / "release").write_text("")
    code, out, err = finish(run)
    assert code == 0, err
    assert out == "released 3\n"
    rec = sh.show(ws)
    assert rec["state"] == "finished" and len([c for c in rec["capsules"] if not c["verified"]]) == 2


def _pty_run(sh: Shell, *args: str) -> tuple[subprocess.Popen[bytes], int]:
    """`sojourn run` in the foreground of a terminal: its own session on a pty, so that a
    Ctrl-C is what the terminal sends, SIGINT to the foreground process group."""
    master, slave = pty.openpty()
    p = subprocess.Popen(sh.cmd(*args), cwd=sh.dir, env=sh.env, stdin=slave, stdout=slave, stderr=slave,
                         start_new_session=True)
    os.close(slave)
    return p, master


def _read_until(master: int, needle: bytes, timeout: float = 60) -> bytes:
    seen = b""
    deadline = time.monotonic() + timeout
    while needle not in seen:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"timed out waiting for {needle!r} in:\n{seen.decode(errors='replace')}")
        ready, _, _ = select.select([master], [], [], left)
        if ready:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # the other end closed
                break
            if not chunk:
                break
            seen += chunk
    return seen


def _drain(master: int, proc: subprocess.Popen[bytes], timeout: float = 60) -> bytes:
    out = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.1)
        if ready:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                chunk = b""
            out += chunk
            if not chunk and proc.poll() is not None:
                break
        elif proc.poll() is not None:
            break
    proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    return out


LOOP = """
import os, time
print("program-ready", flush=True)
n = 0
while not os.path.exists("release"):
    n += 1
    time.sleep(0.01)
print("released", flush=True)
"""


def test_ctrl_c_in_a_terminal_suspends_and_the_resume_carries_on(sh: Shell) -> None:
    sh.write("loop.py", LOOP, prelude=False)
    p, master = _pty_run(sh, "run", "loop.py")
    try:
        seen = _read_until(master, b"program-ready")
        os.killpg(p.pid, signal.SIGINT)  # Ctrl-C: the terminal's foreground group
        out = (seen + _drain(master, p)).decode(errors="replace")
    finally:
        os.close(master)
    assert p.returncode == 75, out
    assert "Ctrl-C" in out and "Traceback" not in out and "KeyboardInterrupt" not in out, out
    ws = sh.show_id(out)
    rec = sh.show(ws)
    assert rec["state"] == "suspended" and rec["last_capsule"]["reason"] == "interrupt", rec
    (sh.dir / "release").write_text("")
    res = sh.cli("resume", ws)
    assert res.returncode == 0, res.stderr
    assert res.stdout == "released\n"


def test_a_second_ctrl_c_within_seconds_interrupts_the_program(sh: Shell) -> None:
    # The program handles KeyboardInterrupt itself: the second Ctrl-C reaches it as Python's
    # own would. Its pause cannot land meanwhile: it sits in one long C call.
    sh.write("stuck.py", """
        import time
        print("program-ready", flush=True)
        try:
            time.sleep(120)
        except KeyboardInterrupt:
            print("interrupted by the user", flush=True)
    """, prelude=False)
    p, master = _pty_run(sh, "run", "stuck.py")
    try:
        seen = _read_until(master, b"program-ready")
        os.killpg(p.pid, signal.SIGINT)
        seen += _read_until(master, b"Ctrl-C")
        os.killpg(p.pid, signal.SIGINT)
        out = (seen + _drain(master, p)).decode(errors="replace")
    finally:
        os.close(master)
    assert "interrupted by the user" in out, out
    assert p.returncode == 0, out
    assert sh.show(sh.show_id(out))["state"] == "finished"


def _catches(pid: int, sig: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    mask = next(int(line.split()[1], 16) for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(mask & (1 << (sig - 1)))


def _children(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []


@pytest.mark.parametrize("command", ["run", "resume"])
def test_sigterm_during_start_up_is_a_pause_request_not_a_kill(sh: Shell, tmp_path: Path, command: str) -> None:
    """Signals are held from the first line of the command: a SIGTERM that arrives while
    `sojourn run`/`resume` is still importing is served once the session runs (the program
    pauses at its first statement boundary), not the default "killed by SIGTERM"."""
    sh.write("loop.py", LOOP, prelude=False)
    args: tuple[str, ...] = ("run", "loop.py")
    before = ""
    if command == "resume":
        first = sh.start("run", "loop.py")
        ws = sh.workspace_of(first)
        assert sh.read_lines(first, 1) == ["program-ready\n"]
        kill(sh.session_pid(ws), signal.SIGTERM)
        code, before, err = finish(first)
        before = "program-ready\n" + before
        assert code == 75, err
        args = ("resume", ws)
    p = sh.start(*args)
    # As soon as the command's first line ran (it catches SIGTERM: /proc says so), while it
    # still imports, long before its session runs the program.
    wait_for(lambda: _catches(p.pid, signal.SIGTERM) or p.poll() is not None, 30, "the command to start")
    kill(p.pid, signal.SIGTERM)
    assert not _children(p.pid), "the signal came after the session was started: not the start-up window"
    code, out, err = finish(p)
    assert code == 75, err
    assert "killed by SIGTERM" not in err
    ws = sh.show_id(err)
    assert sh.show(ws)["state"] == "suspended"
    (sh.dir / "release").write_text("")
    res = sh.cli("resume", ws)
    assert res.returncode == 0, res.stderr
    # It paused at its first statement boundary, or once it was waiting for the file.
    assert before + out + res.stdout == "program-ready\nreleased\n"


# Suspended once while it waits for `release` (a good capsule), then, resumed, it makes the
# object whose capsule fails the write check and waits for `release2`.
LATER_BAD = """
import os, time
class Loaded:
    def __init__(self):
        self.n = 3
    def __setstate__(self, state):
        self.__dict__.update(state)
        self.loaded = True
print("program-ready", flush=True)
while not os.path.exists("release"):
    time.sleep(0.01)
cache = {"a": Loaded()}
print("made the cache", flush=True)
while not os.path.exists("release2"):
    time.sleep(0.01)
print("done", flush=True)
"""


@pytest.mark.slow
def test_a_hard_stop_whose_capsule_fails_its_check_keeps_the_last_good_capsule(sh: Shell) -> None:
    """Where the program cannot go on (the allocation's time is up), the stop says so and the
    workspace stays on its last good capsule, which resumes."""
    sh.write("later.py", LATER_BAD, prelude=False)
    run = sh.start("run", "later.py")
    ws = sh.workspace_of(run)
    assert sh.read_lines(run, 1) == ["program-ready\n"]
    sus = sh.cli("suspend", ws)
    assert sus.returncode == 0, sus.stderr
    good = sus.stdout.strip()
    assert finish(run)[0] == 75
    (sh.dir / "release").write_text("")
    res = sh.cli("resume", ws, "--max-duration", "2s", env={"SOJOURN_HARD_STOP_GRACE": "10"}, timeout=60)
    assert res.returncode == 76, res.stderr
    assert res.stdout == "made the cache\n"
    rec = sh.show(ws)
    assert rec["stop_reason"] == "hard-stop" and rec["state"] == "failed", rec["detail"]
    assert "failed its write check" in rec["detail"] and "'cache'" in rec["detail"], rec["detail"]
    assert "the session was stopped" in rec["detail"]  # at once, not after the 10 s grace
    assert f"keeps its last good capsule {good}" in rec["detail"], rec["detail"]
    assert rec["last_capsule"]["id"] == good
    (sh.dir / "release2").write_text("")
    again = sh.cli("resume", ws)
    assert again.returncode == 0, again.stderr
    assert again.stdout == "made the cache\ndone\n"


def test_a_preemption_notice_whose_capsule_fails_its_check_lets_the_program_run_on(sh: Shell) -> None:
    """Kubernetes' SIGTERM to `sojourn run` (PID 1 in a pod) is a notice: the same answer as a
    suspend, a refusal recorded with the failed capsule, and the program goes on."""
    sh.write("held.py", HELD, prelude=False)
    env = {"SOJOURN_NOTICES": "kubernetes", "KUBERNETES_SERVICE_HOST": "10.96.0.1"}
    run = sh.start("run", "held.py", env=env)
    ws = sh.workspace_of(run)
    assert sh.read_lines(run, 1) == ["waiting\n"]
    kill(run.pid, signal.SIGTERM)
    rec = wait_for(lambda: (r := sh.show(ws))["refusals"] == 1 and r, 60, "the refusal")
    assert rec["state"] == "running" and run.poll() is None
    refused = [e for e in rec["events"] if e["type"] == "refused"]
    assert refused[0]["reason"] == "preempted" and "'cache'" in refused[0]["message"]
    (sh.dir / "release").write_text("")
    code, out, err = finish(run)
    assert code == 0, err
    assert out == "released 3\n" and "preemption notice" in err
    assert sh.show(ws)["state"] == "finished"


def test_an_out_of_memory_capsule_that_fails_its_check_keeps_the_last_good_capsule(sh: Shell) -> None:
    """Out of memory, the program cannot go on: its capsule is checked after the exit; one
    that fails is recorded as failed, the stop says so, and the workspace stays on its last
    good capsule, which resumes (with more memory)."""
    sh.write("grow.py", """
        import os, time
        class Loaded:
            def __init__(self):
                self.n = 3
            def __setstate__(self, state):
                self.__dict__.update(state)
                self.loaded = True
        print("program-ready", flush=True)
        while not os.path.exists("release"):
            time.sleep(0.01)
        cache = {"a": Loaded()}
        blocks = []
        for i in range(3):
            print("grow", i, flush=True)
            blocks.append(bytearray((600 if i == 1 and not os.path.exists("roomy") else 10) << 20))
        print("done", len(blocks))
    """, prelude=False)
    run = sh.start("run", "grow.py")
    ws = sh.workspace_of(run)
    assert sh.read_lines(run, 1) == ["program-ready\n"]
    sus = sh.cli("suspend", ws)
    assert sus.returncode == 0, sus.stderr
    good = sus.stdout.strip()
    assert finish(run)[0] == 75
    (sh.dir / "release").write_text("")
    res = sh.cli("resume", ws, "--memory", "300MiB")
    assert res.returncode == 76, res.stderr
    rec = sh.show(ws)
    assert "failed its write check" in rec["detail"] and f"keeps its last good capsule {good}" in rec["detail"], \
        rec["detail"]
    assert rec["last_capsule"]["id"] == good
    assert [c["verified"] for c in rec["capsules"]] == [True, False]
    (sh.dir / "roomy").write_text("")
    again = sh.cli("resume", ws)
    assert again.returncode == 0, again.stderr
    assert again.stdout == "grow 0\ngrow 1\ngrow 2\ndone 3\n"
