"""The session process: ``python -m sojourn.workspace.session [options] run SCRIPT ARGS... |
resume CAPSULE``.

It runs the engine (``run_script`` / ``resume``) in this process, under the interpreter the
workspace asked for, and talks to its supervisor over two pipes of JSON lines:

* status (session → supervisor): ``started``, ``capsule`` (a pause wrote one), ``refusal``
  (a pause was refused, with the objects' paths), ``status`` (what a pending pause waits
  for), ``exit`` (how the program ended: code, whether it ran, whether it ran out of memory);
* control (supervisor → session): ``pause`` (reason, deadline, what to do at the deadline)
  and ``status``.

Its stdout and stderr are files on this machine that the supervisor tails (logs.py), so its
writes never fail and nothing it writes is lost, whoever dies. Signals keep working as the
engine sets them (SIGTERM and SIGUSR1 pause). When the supervisor dies (the control pipe
ends), the session pauses itself; it then records its capsule, and the output its
supervisor had not logged, in the workspace on its own, so a killed ``sojourn run`` leaves
a suspended workspace, not a lost one.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import platform
import queue
import resource
import sys
import threading
import time
import traceback
from typing import Any

LABEL = "sojourn.workspace"
OOM_TYPES = ("MemoryError", "OutOfMemoryError")


def is_oom(e: BaseException) -> bool:
    return any(t.__name__ in OOM_TYPES for t in type(e).__mro__)


def set_memory_limit(limit: int) -> None:
    # RLIMIT_DATA counts what a program actually maps for data (heap, anonymous mmaps such as
    # numpy's and torch's buffers) but not the address space that thread stacks' guard areas,
    # malloc arenas and BLAS libraries reserve without using: RLIMIT_AS would count those and
    # fail a 300 MiB limit before the program allocated anything.
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))


def set_cpus(n: int) -> None:
    """Run on the first ``n`` CPUs this process may use (a machine's ``cpus``); threads and
    processes the program starts inherit it. Where the platform has no affinity, nothing."""
    if hasattr(os, "sched_setaffinity"):
        allowed = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, allowed[: max(1, n)])


def lift_memory_limit() -> None:
    """Room to write the capsule after an out-of-memory error (the hard limit stays)."""
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    try:
        resource.setrlimit(resource.RLIMIT_DATA, (hard, hard))
    except (ValueError, OSError):
        pass


class Channel:
    def __init__(self, ns: argparse.Namespace):
        self.ns = ns
        self.status_fd: int | None = ns.status_fd
        self.control_fd: int | None = ns.control_fd
        self.lock = threading.Lock()
        self.orphan = False
        # Moves (migrate.py): control messages the main thread waits for (a verdict while held
        # at a boundary, the capsule and the go of an incoming session), the move being held,
        # and the labels dict the engine stamps on capsules (its epoch changes with a move).
        self.waits: queue.Queue[dict[str, Any]] = queue.Queue()
        self.hold_move: str | None = None
        self.hold_timeout: float | None = None
        self.holding = False
        self.incoming = False  # an incoming session before its go: it never held the workspace
        self.restored: str | None = None  # the capsule an incoming session restored, waiting for its go
        self.go_seen = False  # the go of an incoming session arrived (set by the control thread)
        self.restore_usage: tuple[float, Any] | None = None  # (perf_counter, rusage) at the restore's start
        self.held_signals: list[str] = []  # pause signals that came while held for a move
        self.label: dict[str, Any] = {}
        self.cwd = os.getcwd()  # where the write check runs (the program may chdir)
        for fd in (self.status_fd, self.control_fd):
            if fd is not None:
                os.set_inheritable(fd, False)  # not into the program's own subprocesses

    # -- to the supervisor ------------------------------------------------------------------

    def send(self, msg: dict[str, Any]) -> bool:
        if self.status_fd is None:
            return False
        data = (json.dumps(msg, default=str) + "\n").encode()
        with self.lock:
            try:
                while data:
                    n = os.write(self.status_fd, data)
                    data = data[n:]
                return True
            except OSError:
                self.status_fd = None
                return False

    def on_capsule(self, event: Any) -> None:
        msg = {"event": "capsule", "capsule": event.capsule, "parent": event.parent, "reason": event.reason,
               "where": event.where, "size": event.size, "action": event.action,
               "checked": bool(getattr(event, "checked", False)),
               "seconds_to_pause": event.seconds_to_pause, "seconds_capture": event.seconds_capture,
               "max_rss": _max_rss()}
        move = self.hold_move
        if move is not None and event.reason == "move":
            self.hold_move = None
            since = time.perf_counter() - event.paused_at if event.paused_at else event.seconds_capture
            self._hold({**msg, "move": move, "paused_wall": time.time() - since}, move)
            return
        if not self.send(msg) and event.action == "exit":
            self._record_alone(msg)

    def on_edit(self, capsule: str, changes: list[dict[str, Any]]) -> None:
        """Sources edited since ``capsule`` that the resume accepted: recorded in the
        workspace (an ``edited`` event, with each file's diff, cut at 64 KiB)."""
        files = [{**c, "diff": c["diff"] if len(c["diff"]) <= 65536 else c["diff"][:65536] + "\n... (cut)\n"}
                 for c in changes]
        self.send({"event": "edited", "capsule": capsule, "files": files})

    def _hold(self, msg: dict[str, Any], move: str) -> None:
        """A move's capsule is written: stay at this statement boundary until the verdict.
        Exit when the destination won the epoch; carry on (under the epoch the abort took)
        when the move failed, unless a signal asked for a pause meanwhile: then this capsule
        is that pause."""
        from sojourn.workspace.faults import fault

        fault("move.session.after-capsule")
        self.holding = True
        old = self._catch_signals()
        try:
            sent = not self.orphan and self.send(msg)
            fault("move.session.held")
            verdict: dict[str, Any] = {"op": "eof"}
            while sent:
                verdict = self.waits.get()
                if verdict.get("op") == "eof" or (verdict.get("op") == "verdict" and verdict.get("move") == move):
                    break
        finally:
            self._restore_signals(old)
            self.holding = False
        if verdict.get("op") == "eof":  # no supervisor: settle the move here, record it, end
            try:
                from sojourn.workspace.migrate import decide_alone

                decide_alone(self.ns.repo, self.ns.workspace, int(self.ns.epoch), self.ns.allocation, move, msg,
                             self.hold_timeout)
                from sojourn.workspace.logs import remove_output

                remove_output(self.ns.workspace, self.ns.allocation)  # logged, or the workspace is another's
            except Exception as e:
                print(f"sojourn: move {move}: the held session could not settle it: {e}", file=sys.stderr)
            exit_now(EXIT_HELD)
        if verdict.get("go") == "exit":
            fault("move.session.before-exit")
            exit_now(EXIT_HELD)
        if verdict.get("epoch") is not None:
            self.ns.epoch = int(verdict["epoch"])
            self.label["epoch"] = self.ns.epoch
        why = f": {verdict['why']}" if verdict.get("why") else ""
        if self.held_signals or msg.get("action") == "exit":
            # A SIGTERM (or SIGUSR1) came while the move was pending: the program pauses as it
            # asked, at this boundary, with this capsule (the supervisor checks and records it).
            sig = self.held_signals[0] if self.held_signals else "signal"
            self.send({**{k: v for k, v in msg.items() if k not in ("move", "paused_wall")}, "action": "exit",
                       "reason": sig})
            print(f"sojourn: move {move} aborted{why}; pausing as {sig} asked: capsule {msg['capsule']} at "
                  f"{msg.get('where')}", file=sys.stderr, flush=True)
            exit_now(EXIT_HELD)
        self._say_instead(f"checkpoint {msg['capsule']}",
                          f"move {move} aborted{why}; the program continues here (at {msg.get('where')}); "
                          f"capsule {msg['capsule']} was not used")

    def _catch_signals(self) -> dict[int, Any]:
        """While held, the signals that ask for a pause are noted, not acted on (the pause in
        progress is the move's); after an abort the program pauses for them."""
        import signal

        from sojourn.execution import pause

        self.held_signals = []
        try:
            signals = pause.controller().config.signals
        except RuntimeError:
            return {}
        old: dict[int, Any] = {}
        for signum, (action, _, _) in signals.items():
            if action == "exit" and threading.current_thread() is threading.main_thread():
                old[signum] = signal.signal(signum, lambda s, f: self.held_signals.append(signal.Signals(s).name))
        return old

    def _restore_signals(self, old: dict[int, Any]) -> None:
        import signal

        for signum, handler in old.items():
            signal.signal(signum, handler)

    def _say_instead(self, prefix: str, message: str) -> None:
        """The engine logs the next line itself ("checkpoint CAP at ..."): say ``message``
        in its place."""
        from sojourn.execution import pause

        try:
            cfg = pause.controller().config
        except RuntimeError:
            print(f"sojourn: {message}", file=sys.stderr, flush=True)
            return
        prev = cfg.log

        def once(line: str) -> None:
            cfg.log = prev
            text = message if line.startswith(prefix) else line
            if prev is not None:
                prev(text)
            else:
                print(f"sojourn: {text}", file=sys.stderr, flush=True)

        cfg.log = once

    def on_refusal(self, refusal: Any) -> None:
        msg = {"event": "refusal", "reason": refusal.reason, "message": refusal.message,
               "problems": [{"path": p.path, "type": p.type, "reason": p.reason} for p in refusal.problems]}
        if getattr(refusal, "capsule", None):  # written, but failed its write check: recorded as failed
            msg.update(capsule=refusal.capsule, error=refusal.error)
        self.send(msg)

    def verify(self, capsule: str, left: float | None) -> str | None:
        """The write check of a capsule that ends this process, run here while the program
        waits at its statement boundary (``PauseConfig.verify``): a capsule that fails it is
        refused like any pause, and the program keeps running. Within the time the request
        leaves (a notice's deadline), less a second to exit in."""
        from sojourn.workspace.capsules import verify_capsule

        timeout = 600.0 if left is None else max(0.5, left - 1.0)
        if self.ns.files:
            # The capsule carries the directory's files: the check restores them, so it runs in
            # a scratch folder, not over the program's own (as checkpoints.py does).
            import tempfile

            with tempfile.TemporaryDirectory(prefix="sojourn-check-") as tmp:
                return verify_capsule(self.ns.repo, capsule, python=sys.executable, cwd=tmp, timeout=timeout,
                                      raise_timeout=True)
        return verify_capsule(self.ns.repo, capsule, python=sys.executable, cwd=self.cwd, timeout=timeout,
                              raise_timeout=True)

    # -- from the supervisor ----------------------------------------------------------------

    def start(self) -> None:
        if self.control_fd is not None:
            from sojourn import threads

            # At start; a small stack where the default one is refused (`ulimit -v`).
            if threads.start(threading.Thread(target=self._control_loop, name="sojourn-control", daemon=True)) is None:
                raise RuntimeError("sojourn-control: can't start new thread")

    def _control_loop(self) -> None:
        assert self.control_fd is not None
        buf = b""
        while True:
            try:
                data = os.read(self.control_fd, 4096)
            except OSError:
                data = b""
            if not data:
                # A move's destination before its go: the program never ran here. Decided by
                # whether the go *arrived* (it comes on this pipe, before the end), not by whether
                # the main thread has acted on it yet: it may be running the program already.
                if self.incoming and not self.go_seen:
                    from sojourn.workspace.faults import fault

                    fault("session.settle-unstarted")  # a test hook
                    from sojourn.workspace.logs import remove_output

                    remove_output(self.ns.workspace, self.ns.allocation)  # it never held the workspace: not logged
                    if self.restored:
                        try:
                            from sojourn.workspace.incoming import settle_unstarted

                            settle_unstarted(self.ns.repo, self.ns.workspace, self.ns.allocation, self.restored)
                        except Exception as e:
                            print(f"sojourn: {e}", file=sys.stderr)
                    os._exit(0)
                self._supervisor_lost()
                return
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                try:
                    self._handle(json.loads(line))
                except Exception as e:  # a bad message must not kill the program
                    self.send({"event": "error", "message": f"control message failed: {e!r}"})

    def _handle(self, msg: dict[str, Any]) -> None:
        from sojourn.execution import pause

        op = msg.get("op")
        if op == "go":
            self.go_seen = True
        if op in ("verdict", "restore", "go"):
            self.waits.put(msg)
        elif op == "pause" and msg.get("hold"):
            self.hold_move = str(msg["hold"])
            self.hold_timeout = msg.get("timeout")
            # Imported now, so that their first import is not paid while the program is paused.
            import sojourn.capsule.capture
            import sojourn.execution.checkpoint  # noqa: F401
            self._request("move", msg.get("deadline"), "continue", "continue")
        elif op == "pause":
            self._request(str(msg.get("reason", "request")), msg.get("deadline"),
                          str(msg.get("action", "exit")), str(msg.get("on_timeout", "continue")))
        elif op == "status":
            try:
                st = pause.pause_status()
            except RuntimeError:
                st = {"pending": False, "starting": True}
            self.send({"event": "status", **st})

    def _request(self, reason: str, deadline: float | None, action: str, on_timeout: str) -> None:
        from sojourn.execution import pause

        for _ in range(6000):  # the controller starts once the program's code is compiled/restored
            try:
                pause.request_pause(reason, deadline, action, on_timeout)
                return
            except RuntimeError:
                time.sleep(0.05)

    def _supervisor_lost(self) -> None:
        """Nobody records our state any more: pause, so the workspace ends suspended rather
        than lost (the output stays in the files until the orphan logs it)."""
        from sojourn.workspace.faults import fault

        self.orphan = True
        fault("session.orphaned")  # a test hook: the program may run on (and end) before the pause is asked
        if self.holding or self.hold_move is not None:
            self.waits.put({"op": "eof"})  # held for a move: the main thread settles it
            if self.holding:
                return
        self._request("supervisor lost", None, "exit", "continue")

    def report_exit(self, msg: dict[str, Any]) -> None:
        """Tell the supervisor how the program ended. When it is gone (it died while the
        program ran on, before the orphan's pause could land: the program ended first), no
        one else can say it: the session records the allocation's end itself, else a reaper
        would find both processes gone and record ``failed`` with nothing to resume from."""
        if self.send(msg) or not self.ns.workspace or self.incoming:
            return
        self.orphan = True
        try:
            from sojourn.workspace.orphan import record_orphan_exit

            record_orphan_exit(self.ns.repo, self.ns.workspace, self.ns.allocation, int(self.ns.epoch), msg)
        except Exception as e:
            print(f"sojourn: could not record the end of the program in workspace {self.ns.workspace}: {e}",
                  file=sys.stderr)

    def _record_alone(self, msg: dict[str, Any]) -> None:
        """Record a capsule in the workspace without the supervisor (it is gone)."""
        if not self.ns.workspace:
            return
        try:
            from sojourn.workspace.orphan import record_orphan_pause

            record_orphan_pause(self.ns.repo, self.ns.workspace, self.ns.allocation, int(self.ns.epoch), msg)
        except Exception as e:
            print(f"sojourn: could not record the capsule in workspace {self.ns.workspace}: {e}", file=sys.stderr)


def _max_rss() -> int:
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(kib if sys.platform == "darwin" else kib * 1024)


def _print_exception(e: BaseException) -> None:
    # Frames of sojourn itself (this module, the runner, exec) are noise in the user's traceback.
    tb = e.__traceback__
    while tb is not None and "/sojourn/" in tb.tb_frame.f_code.co_filename.replace("\\", "/"):
        tb = tb.tb_next
    traceback.print_exception(type(e), e, tb)


def _program_ran() -> bool:
    try:
        from sojourn.execution import pause

        return bool(pause.controller().enabled)
    except RuntimeError:
        return False


HELD = ("SIGTERM", "SIGUSR1")  # the engine's pause signals (execution.pause.PauseConfig.signals)


def serve_held(ch: Channel) -> None:
    """Signals that came before the engine installed its handlers (``held.py``) become the
    pauses the engine would have made of them, once it has (a thread: the main thread is
    compiling or restoring the program meanwhile)."""
    import signal

    from sojourn.workspace import held

    nums = [getattr(signal, n) for n in HELD]
    while any(held.holding(n) for n in nums):
        time.sleep(0.02)
    from sojourn.execution import pause

    for signum in held.take():
        try:
            action, deadline, on_timeout = pause.controller().config.signals[signum]
        except (RuntimeError, KeyError):
            action, deadline, on_timeout = "exit", 30.0, "exit"
        ch._request(held.name(signum), deadline, action, on_timeout)


def main(argv: list[str] | None = None) -> int:
    import signal

    from sojourn.workspace import held

    held.hold(tuple(getattr(signal, n) for n in HELD))  # first: a SIGTERM now must not kill the session
    parser = argparse.ArgumentParser(prog="python -m sojourn.workspace.session")
    parser.add_argument("--repo", required=True)
    parser.add_argument("--workspace", default="")
    parser.add_argument("--allocation", default="")
    parser.add_argument("--epoch", type=int, default=0)
    parser.add_argument("--status-fd", type=int, default=None)
    parser.add_argument("--control-fd", type=int, default=None)
    parser.add_argument("--memory", type=int, default=None, help="memory limit in bytes")
    parser.add_argument("--scan-interval", type=float, default=600.0)
    parser.add_argument("--cpus", type=int, default=None, help="CPUs the session may use")
    parser.add_argument("--files", default=None, help="capsules carry the files of this directory")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_run = sub.add_parser("run")
    p_run.add_argument("script")
    p_run.add_argument("args", nargs=argparse.REMAINDER)
    p_resume = sub.add_parser("resume")
    p_resume.add_argument("capsule")
    p_in = sub.add_parser("incoming", help="a move's destination: wait for the capsule, restore, wait for go")
    p_in.add_argument("--preload", default="")
    ns = parser.parse_args(argv)

    ch = Channel(ns)
    ch.incoming = ns.cmd == "incoming"
    from sojourn.workspace.liveness import process_start

    if ns.memory:
        set_memory_limit(ns.memory)
    if ns.cpus:
        set_cpus(ns.cpus)
    if ns.cmd != "incoming":
        from sojourn.workspace.faults import fault

        fault("session.before-started")  # a test hook: the record does not name this session yet
    ch.send({"event": "started", "pid": os.getpid(), "pid_start": process_start(os.getpid()),
             "python_version": platform.python_version(), "executable": sys.executable,
             "arch": platform.machine(), "platform": sys.platform})
    ch.start()
    if ns.cmd != "incoming":
        from sojourn import threads

        if threads.start(threading.Thread(target=serve_held, args=(ch,), name="sojourn-held", daemon=True)) is None:
            raise RuntimeError("sojourn-held: can't start new thread")
    else:
        for n in HELD:  # a move's destination: signals act as before its engine starts
            held.release(getattr(signal, n))

    from sojourn.execution import runner

    ch.label = {"workspace": ns.workspace, "allocation": ns.allocation, "epoch": ns.epoch}
    opts: dict[str, Any] = {"repo": ns.repo, "on_capsule": ch.on_capsule, "on_refusal": ch.on_refusal,
                            "scan_interval": ns.scan_interval or None, "labels": {LABEL: ch.label}}
    entry = runner.run_script if ns.cmd == "run" else runner.resume
    if ns.files:
        opts["files"] = ns.files
    if "verify" in inspect.signature(entry).parameters and ns.cmd != "incoming":
        opts["verify"] = ch.verify  # checked before the process ends: a failed check ends no job
    if "on_oom" in inspect.signature(entry).parameters:
        # The engine captures an out-of-memory error as a capsule: give that capture room.
        opts["on_oom"] = lambda e: lift_memory_limit()
    if ns.cmd == "incoming":
        ns.capsule = incoming_capsule(ch, ns.preload)
        opts["before_run"] = lambda: incoming_go(ch)
    if ns.cmd != "run" and "on_edit" in inspect.signature(entry).parameters:
        opts["on_edit"] = lambda changes: ch.on_edit(ns.capsule, changes)
    try:
        if ns.cmd == "run":
            code = runner.run_script(ns.script, ns.args, **opts)
        else:
            code = runner.resume(ns.capsule, **opts)
    except SystemExit as e:
        code = _exit_code(e)
    except runner.ResumeError as e:
        print(f"sojourn: error: {e}", file=sys.stderr)
        code = 2
        ch.report_exit({"event": "exit", "code": code, "ran": False, "error": "ResumeError", "message": str(e)})
        return code
    except BaseException as e:
        oom = is_oom(e)
        if oom:
            lift_memory_limit()
        ran = _program_ran()
        _print_exception(e)
        code = 130 if isinstance(e, KeyboardInterrupt) else 1
        ch.report_exit({"event": "exit", "code": code, "ran": ran, "error": type(e).__name__, "oom": oom,
                        "message": str(e)[:2000]})
        return code
    ch.report_exit({"event": "exit", "code": code, "ran": True})
    return code


EXIT_HELD = 75  # a session held for a move ends: the program carries on elsewhere (or stays in its capsule)


def exit_now(code: int) -> None:
    """End the process at once, as the engine does after a pause (its before-exit cleanups,
    the streams flushed)."""
    from sojourn.execution import pause

    for fn in list(getattr(pause, "_BEFORE_EXIT", [])):
        try:
            fn()
        except Exception:
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)


def incoming_capsule(ch: Channel, preload: str) -> str:
    """A move's destination: warm up (the engine, the capsule reader, the program's big
    libraries), say so, then wait for the capsule to restore."""
    import importlib

    ch.incoming = True
    for name in ("sojourn.execution.runner", "sojourn.capsule.restore", "sojourn.capsule.format",
                 "sojourn.execution.resumeform", "sojourn.execution.reducers", "sojourn.execution.loaders",
                 *[m for m in preload.split(",") if m]):
        try:
            importlib.import_module(name)
        except Exception:
            pass  # the restore says what is missing, if it matters
    ch.send({"event": "warm", "pid": os.getpid()})
    while True:
        msg = ch.waits.get()
        if msg.get("op") == "restore":
            from sojourn.workspace.faults import fault

            fault("move.incoming.before-restore")
            ch.restore_usage = (time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF))
            return str(msg["capsule"])


def _restore_usage(ch: Channel) -> dict[str, float] | None:
    """The restore's wall, user and system seconds (the ``move`` event's ``restore``): system
    time is where a first touch of memory shows (docs/moves.md, "Time")."""
    if ch.restore_usage is None:
        return None
    t0, r0 = ch.restore_usage
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    return {"wall": round(time.perf_counter() - t0, 4), "user": round(r1.ru_utime - r0.ru_utime, 4),
            "system": round(r1.ru_stime - r0.ru_stime, 4)}


def incoming_go(ch: Channel) -> None:
    """Restored and checked (``runner.resume`` compares every fingerprint before this):
    report, then wait for the go, which comes once the destination won the epoch."""
    from sojourn.workspace.faults import fault

    fault("move.incoming.after-restore")
    ch.restored = str(ch.ns.capsule)
    ch.send({"event": "restored", "timings": _restore_usage(ch)})
    while True:
        msg = ch.waits.get()
        if msg.get("op") == "go":
            break
    fault("session.incoming-go")  # a test hook: the control thread may see its pipe end meanwhile
    ch.ns.epoch = int(msg["epoch"])
    ch.label["epoch"] = ch.ns.epoch
    ch.incoming = False
    ch.send({"event": "running", "t": time.time()})


def _exit_code(e: SystemExit) -> int:
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code
    print(e.code, file=sys.stderr)
    return 1


if __name__ == "__main__":
    rc = main()
    # The program is over (its end is reported): a SIGTERM now has nothing to pause, and
    # interpreter shutdown would give it back its default action, so that the session "was
    # killed by SIGTERM" after it finished. Ignored handlers survive the shutdown.
    import signal

    for _n in HELD:
        signal.signal(getattr(signal, _n), signal.SIG_IGN)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    sys.exit(rc)
