"""What cannot travel refuses the pause, with paths, and the program keeps running; a pause that
cannot land before its deadline gives up with a clear message instead of hanging."""

from __future__ import annotations

import sys
import time

from tests.execution.conftest import EXIT_PAUSED, Runner

EXIT_PAUSE_FAILED = 76


def test_live_thread_socket_and_child_process_refuse_the_pause(runner: Runner) -> None:
    script = runner.write("held.py", """
        import socket, subprocess, sys, threading
        stop = threading.Event()
        worker = threading.Thread(target=stop.wait, name="worker")
        worker.start()
        conn = socket.socket()
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        for i in range(3):
            kill_here(i)
            print("step", i, flush=True)
        stop.set(); worker.join(); conn.close(); child.kill(); child.wait()
        print("done")
    """)
    chain = runner.chain(script, kills="1")
    assert [s.returncode for s in chain.segments] == [0]
    runner.same_as_plain(script, chain)
    err = chain.segments[0].stderr
    assert "pause refused (SIGTERM); the program keeps running" in err
    assert "<thread 'worker'>" in err and "Event.wait" in err  # the thread and what it runs


def test_unpicklable_objects_are_listed_with_their_paths(runner: Runner) -> None:
    script = runner.write("paths.py", """
        import socket, subprocess, sys
        class Client:
            def __init__(self):
                self.conn = socket.socket()
                self.helpers = {"proc": subprocess.Popen([sys.executable, "-c", "pass"])}
        def work(client):
            for i in range(3):
                kill_here(i)
                print("work", i, flush=True)
        c = Client()
        work(c)
        c.conn.close(); c.helpers["proc"].wait()
        print("done")
    """)
    chain = runner.chain(script, kills="1")
    assert [s.returncode for s in chain.segments] == [0]
    runner.same_as_plain(script, chain)
    err = chain.segments[0].stderr
    assert "c.conn" in err and "c.helpers['proc']" in err, err


def test_deadline_exits_when_a_sigterm_pause_can_never_land(runner: Runner) -> None:
    script = runner.write("stuck.py", """
        import time
        def slow_key(v):
            kill_here("go")  # the signal arrives while sorted() (C code) is calling back
            for i in range(10):
                time.sleep(0.002)
            return -v
        print("sorting", flush=True)
        data = sorted(range(2000), key=slow_key)
        print("sorted", data[:3])
    """)
    t0 = time.monotonic()
    seg = runner.segment(sys.executable, ["run", str(script)], env={"KILLS": "go"}, opts=("--deadline", "1"))
    assert seg.returncode == EXIT_PAUSE_FAILED, seg.stderr
    assert time.monotonic() - t0 < 20
    assert "could not pause within 1 s (SIGTERM)" in seg.stderr
    assert "slow_key was called from inside an expression" in seg.stderr or "library code" in seg.stderr
    assert "exiting without a capsule" in seg.stderr


def test_deadline_gives_up_and_keeps_running_for_sigusr1(runner: Runner) -> None:
    script = runner.write("async_loop.py", """
        import asyncio
        async def tick(n):
            total = 0
            for i in range(n):
                total += i
                await asyncio.sleep(0.01)
            return total
        async def main():
            kill_here("go", _signal.SIGUSR1)
            print("result", await tick(150), flush=True)
        asyncio.run(main())
        print("after")
    """)
    seg = runner.segment(sys.executable, ["run", str(script)], env={"KILLS": "go"}, opts=("--deadline", "0.5"))
    assert seg.returncode == 0, seg.stderr
    assert seg.stdout == runner.plain(script).stdout
    assert "could not pause within 0.5 s (SIGUSR1)" in seg.stderr
    assert "coroutine" in seg.stderr and "async_loop.py" in seg.stderr
    assert "the program keeps running" in seg.stderr


def test_pause_during_a_long_c_call_lands_when_it_returns(runner: Runner) -> None:
    script = runner.write("sleepy.py", """
        import time
        for i in range(3):
            print("before", i, flush=True)
            time.sleep(1.0 if i == 1 else 0)
            print("after", i, flush=True)
    """)
    chain = runner.external(script, after_lines=[3])  # sent while time.sleep(1.0) runs
    assert [s.returncode for s in chain.segments] == [EXIT_PAUSED, 0]
    runner.same_as_plain(script, chain)
    assert chain.segments[0].stdout.endswith("after 1\n")


def test_periodic_scan_warns_before_any_pause(runner: Runner) -> None:
    script = runner.write("warn.py", """
        import socket, time
        conn = socket.socket()
        for i in range(30):
            time.sleep(0.02)
        conn.close()
        print("done")
    """)
    seg = runner.segment(sys.executable, ["run", str(script)], opts=("--scan-interval", "0.2"))
    assert seg.returncode == 0
    assert "warning: a pause now would be refused" in seg.stderr and "conn" in seg.stderr


def test_coroutine_object_in_state_is_refused_precisely(runner: Runner) -> None:
    script = runner.write("coro.py", """
        async def later():
            return 1
        pending = later()
        for i in range(3):
            kill_here(i)
            print(i, flush=True)
        pending.close()
    """)
    chain = runner.chain(script, kills="1")
    assert [s.returncode for s in chain.segments] == [0]
    err = chain.segments[0].stderr
    assert "pending" in err and "coroutine (async def)" in err


def test_second_signal_while_a_pause_is_pending_is_harmless(runner: Runner) -> None:
    script = runner.write("twice.py", """
        import os, signal
        for i in range(5):
            if i == 2:
                os.kill(os.getpid(), signal.SIGUSR1)
                os.kill(os.getpid(), signal.SIGTERM)
            print(i, flush=True)
    """)
    chain = runner.chain(script)
    assert [s.returncode for s in chain.segments] == [EXIT_PAUSED, 0]
    assert chain.stdout == "0\n1\n2\n3\n4\n"


def test_a_program_that_ignores_nothing_still_finishes_without_signals(runner: Runner) -> None:
    script = runner.write("plain.py", """
        import subprocess, sys
        out = subprocess.run([sys.executable, "-c", "print('child')"], capture_output=True, text=True).stdout
        print(out.strip(), sum(i * i for i in range(100)))
    """)
    seg = runner.segment(sys.executable, ["run", str(script)])
    assert seg.returncode == 0 and seg.stdout == runner.plain(script).stdout
    assert seg.stderr == ""
