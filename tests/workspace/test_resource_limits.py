"""Under an address-space limit (`ulimit -v`, common on shared clusters) as tight as the
program itself can live with, a pause lands and resumes: no thread that a capture, the write
check or the supervisor needs at pause time is allowed to cost the capsule.

The limit is set on real processes (``RLIMIT_AS`` in a preexec_fn, inherited by the session
and the write check) and chosen by first measuring: the program's own VmPeak and the
supervisor's under a generous limit, plus a margin for the capture's buffers. Before
sojourn.threads, a pause at such a limit was refused with "can't start new thread" (the chunk
writers' 8 MiB stacks) and the program ran on unpaused.
"""

from __future__ import annotations

import resource
import signal
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from tests.workspace.conftest import Shell, finish, kill

# The capture's own working memory: the pickled state and a compressed chunk or two in flight.
MARGIN = 32 << 20
GENEROUS = 2 << 30
# After a MemoryError the engine frees its reserve for the capture: the program's peak is enough.
OOM_MARGIN = 0

JOB = """
import hashlib, sys, time
blob = bytearray(hashlib.sha256(str(i).encode()).digest()[i % 32] for i in range(4 << 20))
rows = [(i, str(i) * 3) for i in range(50000)]
steps = int(sys.argv[1])
total = 0
for i in range(steps):
    total += rows[i * 7][0] + blob[i * 1000]
    time.sleep(0.05)
    if i == 5:
        print("started", flush=True)
    if i == 10:
        peak = open("/proc/self/status").read().split("VmPeak:")[1].split()[0]
        print("peak", peak, file=sys.stderr, flush=True)
    if i % 50 == 0:
        print("step", i, total, flush=True)
print("done", total, hashlib.sha256(blob).hexdigest()[:16], len(rows))
"""


def _limit(nbytes: int) -> Callable[[], None]:
    def pre() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (nbytes, nbytes))

    return pre


def _start(sh: Shell, limit: int, *args: str) -> subprocess.Popen[str]:
    p = subprocess.Popen(sh.cmd(*args), cwd=sh.dir, env=sh.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, preexec_fn=_limit(limit))
    sh.procs.append(p)
    return p


def _cli(sh: Shell, limit: int, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(sh.cmd(*args), cwd=sh.dir, env=sh.env, capture_output=True, text=True, timeout=timeout,
                          preexec_fn=_limit(limit))


def _vm_peak(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(f.read().split("VmPeak:")[1].split()[0]) << 10


def _read_err_until(proc: subprocess.Popen[str], prefix: str) -> str:
    assert proc.stderr is not None
    seen = ""
    while True:
        line = proc.stderr.readline()
        assert line, f"the run ended before printing {prefix!r}:\n{seen}"
        seen += line
        if line.startswith(prefix):
            return line


def _tight_limit(sh: Shell, margin: int = MARGIN) -> int:
    """The program's VmPeak (in its session) or the supervisor's, whichever is larger, under
    a generous limit (where sessions get their few malloc arenas too), plus the margin."""
    run = _start(sh, GENEROUS, "run", "--name", "measure", "job.py", "12")
    sh.workspace_of(run)
    program = int(_read_err_until(run, "peak").split()[1]) << 10
    supervisor = _vm_peak(run.pid)
    code, _, err = finish(run)
    assert code == 0, err
    return max(program, supervisor) + margin


def _pause_and_resume(sh: Shell, limit: int, stop: Callable[[subprocess.Popen[str], str], Any]) -> str:
    expected = sh.plain("job.py", "160")
    run = _start(sh, limit, "run", "--name", "limited", "job.py", "160")
    ws = sh.workspace_of(run)
    got = sh.read_lines(run, 2)
    assert got[-1] == "started\n", got
    stop(run, ws)
    code, out, err = finish(run)
    assert code == 75, err
    assert "can't start new thread" not in err and "pause refused" not in err, err
    assert sh.show(ws)["state"] == "suspended"
    res = _cli(sh, limit, "resume", ws)  # a fresh interpreter, under the same limit
    assert res.returncode == 0, res.stderr
    assert "".join(got) + out + res.stdout == expected
    return err


@pytest.mark.slow
def test_suspend_lands_under_a_tight_address_space_limit(sh: Shell) -> None:
    sh.write("job.py", JOB, prelude=False)
    limit = _tight_limit(sh)

    def suspend(run: subprocess.Popen[str], ws: str) -> None:
        sus = _cli(sh, limit, "suspend", ws)
        assert sus.returncode == 0, sus.stderr
        assert "checked" in sus.stderr, sus.stderr

    _pause_and_resume(sh, limit, suspend)


@pytest.mark.slow
def test_sigterm_lands_under_a_tight_address_space_limit(sh: Shell) -> None:
    sh.write("job.py", JOB, prelude=False)
    limit = _tight_limit(sh)
    err = _pause_and_resume(sh, limit, lambda run, ws: kill(sh.session_pid(ws), signal.SIGTERM))
    assert "paused (SIGTERM" in err


NO_ROOM = """
import resource, sys, threading
from sojourn.threads import Executor, start_or_run
junk = [bytearray(100) for _ in range(20000)]; del junk  # room in the heap for what follows
vm = int(open("/proc/self/status").read().split("VmSize:")[1].split()[0]) << 10
resource.setrlimit(resource.RLIMIT_AS, (vm + int(sys.argv[1]), resource.RLIM_INFINITY))
ran = []
t = start_or_run(lambda: ran.append(threading.current_thread().name), name="sojourn-test")
if t is not None:
    t.join()
with Executor(4, thread_name_prefix="sojourn-chunks") as pool:
    # A job that submits more, like a buffer's chunks: inline it must not deadlock.
    outer = [pool.submit(lambda i=i: [pool.submit(pow, i, 2) for _ in range(3)]) for i in range(5)]
    inner = [f.result() for o in outer for f in o.result()]
print(ran[0], sum(inner), len(pool._threads))
"""


@pytest.mark.parametrize(("room", "where", "workers"), [(0, "MainThread", 0), (4 << 20, "sojourn-test", 4)])
def test_work_is_done_where_no_thread_can_start(room: int, where: str, workers: int) -> None:
    """In a real process whose address space has no room left for a thread (0) or only for
    small stacks (4 MiB): the work is done inline, or on 512 KiB stacks; said once."""
    from tests.conftest import SRC

    env = {"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"}
    p = subprocess.run([sys.executable, "-c", NO_ROOM, str(room)], env=env, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == [where, str(3 * sum(i * i for i in range(5))), str(workers)]
    assert p.stderr.count("a thread could not be started") == (1 if workers == 0 else 0), p.stderr


OOM = """
import hashlib, sys, time
blob = bytearray(hashlib.sha256(str(i).encode()).digest()[i % 32] for i in range(4 << 20))
big = int(sys.argv[1])
parts = []
for i in range(6):
    print("step", i, flush=True)
    parts.append(bytearray(big if i == 3 else 1000))
print("done", sum(len(p) for p in parts), hashlib.sha256(blob).hexdigest()[:16])
"""


@pytest.mark.slow
def test_out_of_memory_under_a_tight_address_space_limit_keeps_a_capsule(sh: Shell) -> None:
    """The program's own allocation fails under the limit: the capsule positioned before it
    is written and resumes, without the limit, to the end. The user sets few malloc arenas
    here, so that the limit is as tight for a sojourn without its own setting of them."""
    sh.env["MALLOC_ARENA_MAX"] = "2"
    sh.write("job.py", JOB, prelude=False)
    limit = _tight_limit(sh, OOM_MARGIN)
    sh.write("oom.py", OOM, prelude=False)
    expected = sh.plain("oom.py", str(limit))
    run = _start(sh, limit, "run", "--name", "oom", "oom.py", str(limit))
    ws = sh.workspace_of(run)
    code, out, err = finish(run)
    assert code == 77, err
    assert "can't start new thread" not in err and "no capsule was written" not in err, err
    assert out == "step 0\nstep 1\nstep 2\nstep 3\n"
    assert sh.show(ws)["state"] == "suspended"
    res = sh.cli("resume", ws, timeout=180)
    assert res.returncode == 0, res.stderr
    assert out + res.stdout == expected


FILL = """
import numpy as np
parts = []
for i in range(400):
    parts.append(np.full(1 << 17, i, dtype=np.int64))  # 1 MiB each
    if i % 50 == 0:
        print("step", i, flush=True)
print("done", len(parts), int(sum(int(p[0]) for p in parts)))
"""


def test_a_program_that_fills_a_soft_address_space_limit_keeps_its_capsule(sh: Shell) -> None:
    """A program filling memory up to a soft RLIMIT_AS (hard: unlimited) runs out of memory:
    the capsule is written, and its write check, a fresh interpreter that restores all of that
    state, runs with the hard limit (under the soft one it failed with MemoryError, and the
    workspace ended `failed` with nothing to resume). Resumed without the limit, it completes."""
    pytest.importorskip("numpy")
    sh.write("fill.py", FILL, prelude=False)
    expected = sh.plain("fill.py")
    limit = 350 << 20
    p = subprocess.Popen(sh.cmd("run", "--name", "fill", "fill.py"), cwd=sh.dir, env=sh.env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY)))
    sh.procs.append(p)
    ws = sh.workspace_of(p)
    code, out, err = finish(p)
    assert code == 77, err
    assert "failed its write check" not in err and "ran out of memory at" in err, err
    assert sh.show(ws)["state"] == "suspended"
    assert "done" not in out
    res = sh.cli("resume", ws, timeout=180)
    assert res.returncode == 0, res.stderr
    assert out + res.stdout == expected
