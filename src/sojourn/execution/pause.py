"""Pause requests: signals, commands and deadlines, and what happens when a pause lands.

A request only sets a flag (signal handlers and watcher threads may not do more). The main
thread sees it at its next pause check and tries, in order:

1. the position (:mod:`position`): library code or an expression on the stack *defers* the
   pause to a later check;
2. the autograd guard (:mod:`autograd`): a live graph defers it too;
3. threads: a live non-daemon thread *refuses* it;
4. the capture: objects that cannot travel *refuse* it, with the path of each.

A refused pause is logged (stderr is the session's log) and the program carries on. A pause
that cannot land before its deadline is given up with a message that says why and where the
program was. A capsule that is written ends the process with :data:`EXIT_PAUSED` (or, for a
checkpoint, lets it carry on). An out-of-memory error escaping a statement of the program
goes through :mod:`oom` and ends it with :data:`~sojourn.execution.oom.EXIT_OOM`.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sojourn.errors import Problem
from sojourn.execution.position import CO_COROUTINE, Deferred, Refused, describe_frame
from sojourn.execution.runtime import RUNTIME, Runtime, TransformedModule

EXIT_PAUSED = 75  # a capsule was written; `resume` carries on (EX_TEMPFAIL)
EXIT_PAUSE_FAILED = 76  # a pause had to be taken (SIGTERM) but could not be before its deadline
EXIT_OOM = 77  # out of memory inside a loop: a capsule positioned before the failing statement (see oom)

# Run just before the process ends with a capsule (os._exit skips atexit): e.g. DataLoader
# workers are shut down, so that they do not hold the session's output pipes open.
_BEFORE_EXIT: list[Callable[[], None]] = []


def before_exit(fn: Callable[[], None]) -> Callable[[], None]:
    if fn not in _BEFORE_EXIT:
        _BEFORE_EXIT.append(fn)
    return fn


@dataclass(frozen=True)
class PauseEvent:
    """What a pause produced, handed to ``on_capsule`` before the process exits."""

    capsule: str
    parent: str | None
    reason: str
    where: str
    size: int
    seconds_to_pause: float  # from the request to the statement boundary
    seconds_capture: float
    action: str  # "exit" or "continue"
    paused_at: float = 0.0  # time.perf_counter() when the statement boundary was reached


@dataclass(frozen=True)
class PauseRefusal:
    reason: str
    message: str
    problems: tuple[Problem, ...] = ()


@dataclass
class _Request:
    reason: str
    action: str
    deadline: float | None
    on_timeout: str
    t0: float = field(default_factory=time.perf_counter)
    done: threading.Event = field(default_factory=threading.Event)
    deferrals: int = 0
    last_deferral: str = ""
    kind: str = "pause"  # or "scan"


@dataclass
class PauseConfig:
    repo: Any = None
    files: str | None = None
    parent: str | None = None
    labels: dict[str, Any] = field(default_factory=dict)
    on_capsule: Callable[[PauseEvent], None] | None = None
    on_refusal: Callable[[PauseRefusal], None] | None = None
    log: Callable[[str], None] | None = None
    # signal -> (action, deadline seconds, what to do when it passes)
    signals: dict[int, tuple[str, float | None, str]] = field(default_factory=lambda: {
        signal.SIGTERM: ("exit", 30.0, "exit"),
        signal.SIGUSR1: ("exit", 120.0, "continue"),
    })
    scan_interval: float | None = 600.0
    # Called with the error, in the main thread, before an out-of-memory capture (make room).
    on_oom: Callable[[BaseException], None] | None = None
    oom_reserve: int | None = None  # bytes held back for that capture (None: SOJOURN_OOM_RESERVE or 32 MiB)


class PauseController:
    """Decides, at each pause check, whether and how the program pauses now."""

    def __init__(self, rt: Runtime, config: PauseConfig):
        self.rt = rt
        self.config = config
        self.lock = threading.RLock()
        self.request: _Request | None = None
        self.busy = False
        self.enabled = False
        self.main_thread = threading.main_thread().ident
        self.skip = 0
        self._wake = threading.Event()
        self.history: list[PauseEvent] = []
        self.oom_notes: dict[int, str] = {}  # id(error) -> why no out-of-memory capsule was taken

    # -- requests (any thread) ---------------------------------------------------------------------

    def request_pause(self, reason: str, deadline: float | None = None, action: str = "exit",
                      on_timeout: str = "continue") -> None:
        if action not in ("exit", "continue") or on_timeout not in ("exit", "continue"):
            raise ValueError("action and on_timeout must be 'exit' or 'continue'")
        with self.lock:
            req = self.request
            if req is not None and not req.done.is_set() and req.kind == "pause":
                if action == "exit":
                    req.action = "exit"
                if deadline is not None and (req.deadline is None or deadline < req.deadline):
                    req.deadline = deadline
                    self._watch(req)
                if on_timeout == "exit":
                    req.on_timeout = "exit"
                return
            req = self.request = _Request(reason, action, deadline, on_timeout)
            self.skip = 0
            self.rt.set_flag(True)
            if deadline is not None:
                self._watch(req)

    def request_scan(self) -> None:
        with self.lock:
            if self.request is None or self.request.done.is_set():
                self.request = _Request("scan", "continue", None, "continue", kind="scan")
                self.rt.set_flag(True)

    def status(self) -> dict[str, Any]:
        req = self.request
        if req is None or req.done.is_set():
            return {"pending": False}
        return {
            "pending": True,
            "reason": req.reason,
            "seconds": time.perf_counter() - req.t0,
            "deferrals": req.deferrals,
            "waiting_for": req.last_deferral or self.where_main(),
        }

    def _watch(self, req: _Request) -> None:
        # One watchdog thread for the whole run, woken here: starting a thread inside a signal
        # handler would make the main thread wait for it, delaying the very pause it watches.
        self._wake.set()

    def _watchdog(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            req = self.request
            if req is None:
                continue
            while not req.done.wait(0.1):
                if req.deadline is not None and time.perf_counter() - req.t0 >= req.deadline:
                    self._timeout(req)
                    break

    def _timeout(self, req: _Request) -> None:
        with self.lock:
            if req.done.is_set():
                return
            why = req.last_deferral or self.where_main()
            msg = f"could not pause within {req.deadline:g} s ({req.reason}): {why}"
            req.done.set()
            self.rt.set_flag(False)
            if req.on_timeout == "exit":
                last = self.config.parent or "none"
                self._log(f"{msg}; exiting without a capsule (last capsule: {last})")
                _flush()
                os._exit(EXIT_PAUSE_FAILED)
            self._log(f"{msg}; the program keeps running")
            self._refused(PauseRefusal(req.reason, msg))

    def where_main(self) -> str:
        frame = sys._current_frames().get(self.main_thread or 0)
        if frame is None:
            return "the main thread is not running Python code"
        f: types.FrameType | None = frame
        while f is not None:
            if f.f_code.co_flags & CO_COROUTINE:
                return (f"the program is running async code (coroutine {f.f_code.co_qualname} at "
                        f"{f.f_code.co_filename}:{f.f_lineno}); pauses inside coroutines are not "
                        "supported, the pause lands once the event loop returns")
            if self.rt.scope_of(f.f_code) is not None:
                if any("asyncio" in g.f_code.co_filename for g in _stack(frame, f)):
                    return (f"the program is running an asyncio event loop (from {f.f_code.co_filename}:"
                            f"{f.f_lineno}); pauses inside coroutines are not supported, the pause "
                            "lands once the event loop returns")
                if f is frame:
                    return f"the program is at {f.f_code.co_filename}:{f.f_lineno}"
                return (f"the main thread is in {describe_frame(frame)}, called from "
                        f"{f.f_code.co_filename}:{f.f_lineno}; the pause lands when it returns")
            f = f.f_back
        return f"the main thread is in {describe_frame(frame)}"

    # -- the check (main thread) -------------------------------------------------------------------

    def at_check(self, tm: TransformedModule, sid: int, frame: types.FrameType) -> None:
        req = self.request
        if req is None or req.done.is_set():
            self.rt.set_flag(False)
            return
        if self.busy or not self.enabled or threading.get_ident() != self.main_thread:
            return
        if self.skip:
            self.skip -= 1
            return
        now = time.perf_counter()
        self.busy = True
        try:
            with self.lock:
                if req.done.is_set():
                    return
                self._attempt(req, tm, sid, frame, now)
        finally:
            self.busy = False

    def _attempt(self, req: _Request, tm: TransformedModule, sid: int, frame: types.FrameType, now: float) -> None:
        from sojourn.execution import checkpoint as cap

        try:
            pos = cap.position_at(self.rt, frame, sid)
            if req.kind == "scan":
                self._scan(req, pos)
                return
            cap.check_autograd(self.rt, pos)
            cap.check_threads()
            event = cap.write_capsule(self.rt, pos, self.config, req, now)
        except Deferred as d:
            req.deferrals += 1
            if req.kind == "pause" and str(d) != req.last_deferral:
                self._log(f"pause deferred: {d}")
            req.last_deferral = str(d)
            if getattr(d, "backoff", False):
                # An expensive check (a walk over the program's objects) is not repeated at
                # every statement, only at every 50th.
                self.skip = 50
            return
        except Refused as r:
            self._give_up(req, PauseRefusal(req.reason, str(r), tuple(r.problems)))
            return
        except Exception as e:  # a pause must never crash the program it pauses
            from sojourn.errors import CaptureError

            problems = tuple(e.problems) if isinstance(e, CaptureError) else ()
            message = str(e) if isinstance(e, CaptureError) else f"the capture failed: {type(e).__name__}: {e}"
            self._give_up(req, PauseRefusal(req.reason, message, problems))
            return
        if event.action == "exit":
            self.landed(event, EXIT_PAUSED,
                        f"paused ({event.reason}, {event.seconds_to_pause * 1e3:.2f} ms after the request) at "
                        f"{event.where}; capsule {event.capsule} ({event.size} bytes, written in "
                        f"{event.seconds_capture * 1e3:.0f} ms); resume it to carry on")
        self.landed(event, None, f"checkpoint {event.capsule} at {event.where}")
        req.done.set()
        self.rt.set_flag(False)

    def landed(self, event: PauseEvent, exit_code: int | None, message: str) -> None:
        """A capsule was written: tell the callback, log it, and end the process with
        ``exit_code`` (None: a checkpoint, the program carries on)."""
        self.history.append(event)
        self.config.parent = event.capsule
        if self.config.on_capsule is not None:
            try:
                self.config.on_capsule(event)
            except Exception as e:  # the capsule is written; a failing callback must not lose it
                self._log(f"on_capsule failed for {event.capsule}: {type(e).__name__}: {e}")
        self._log(message)
        if exit_code is None:
            return
        for fn in list(_BEFORE_EXIT):
            try:
                fn()
            except Exception as e:
                self._log(f"cleanup before exit failed: {type(e).__name__}: {e}")
        _flush()
        os._exit(exit_code)

    def at_oom(self, tm: TransformedModule, sid: int, frame: types.FrameType, header: bool) -> None:
        from sojourn.execution import oom

        oom.handle(self, tm, sid, frame, header)

    def _give_up(self, req: _Request, refusal: PauseRefusal) -> None:
        req.done.set()
        self.rt.set_flag(False)
        lines = [f"pause refused ({req.reason}); the program keeps running: {refusal.message}"]
        if refusal.problems and refusal.message.count("\n") == 0:
            lines += [f"  - {p}" for p in refusal.problems]
        self._log("\n".join(lines))
        self._refused(refusal)

    def _refused(self, refusal: PauseRefusal) -> None:
        if self.config.on_refusal is not None:
            try:
                self.config.on_refusal(refusal)
            except Exception as e:
                self._log(f"on_refusal failed: {type(e).__name__}: {e}")

    def _scan(self, req: _Request, pos: Any) -> None:
        from sojourn.execution import checkpoint as cap

        req.done.set()
        self.rt.set_flag(False)
        problems = cap.scan_state(self.rt, pos, rehearse=False)
        if problems:
            self._warn_scan(problems)
            return
        # What the write check would refuse: rehearsed in a forked child while the program
        # runs on; a thread waits for its answer.
        if getattr(self, "_rehearsing", False):
            return  # one child at a time: a short scan interval must not pile them up
        wait = cap.rehearse_state(self.rt, pos)
        if wait is not None:
            self._rehearsing = True
            threading.Thread(target=self._rehearsed, args=(wait,), name="sojourn-rehearse", daemon=True).start()

    def _rehearsed(self, wait: Any) -> None:
        try:
            problems = wait()
        except Exception as e:
            self._log(f"the rehearsal of the write check failed: {type(e).__name__}: {e}")
            return
        finally:
            self._rehearsing = False
        if problems:
            self._warn_scan(problems)

    def _warn_scan(self, problems: Any) -> None:
        self._log("warning: a pause now would be refused:\n" + "\n".join(f"  - {p}" for p in problems))

    def _log(self, message: str) -> None:
        if self.config.log is not None:
            self.config.log(message)
        else:
            print(f"sojourn: {message}", file=sys.stderr, flush=True)

    log = _log

    # -- installation ------------------------------------------------------------------------------

    def install(self) -> None:
        from sojourn.execution import oom

        self.rt.on_pause = self.at_check
        self.rt.on_oom = self.at_oom
        oom.RESERVE.hold(oom.reserve_size() if self.config.oom_reserve is None else self.config.oom_reserve)
        threading.Thread(target=self._watchdog, name="sojourn-deadline", daemon=True).start()
        for signum, (action, deadline, on_timeout) in self.config.signals.items():
            name = signal.Signals(signum).name

            def handler(s: int, f: Any, name: str = name, action: str = action,
                        deadline: float | None = deadline, on_timeout: str = on_timeout) -> None:
                self.request_pause(name, deadline, action, on_timeout)

            signal.signal(signum, handler)
        if self.config.scan_interval:
            t = threading.Thread(target=self._scan_loop, name="sojourn-scan", daemon=True)
            t.start()

    def _scan_loop(self) -> None:
        interval = self.config.scan_interval or 0
        while True:
            time.sleep(interval)
            if self.enabled:
                self.request_scan()


def _stack(inner: types.FrameType, outer: types.FrameType) -> list[types.FrameType]:
    out = []
    f: types.FrameType | None = inner
    while f is not None and f is not outer:
        out.append(f)
        f = f.f_back
    return out


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass


_CONTROLLER: PauseController | None = None


def controller() -> PauseController:
    if _CONTROLLER is None:
        raise RuntimeError("no program is running under sojourn in this process")
    return _CONTROLLER


def start(config: PauseConfig, rt: Runtime = RUNTIME) -> PauseController:
    global _CONTROLLER
    _CONTROLLER = PauseController(rt, config)
    _CONTROLLER.install()
    return _CONTROLLER


def request_pause(reason: str = "request", deadline: float | None = None, action: str = "exit",
                  on_timeout: str = "continue") -> None:
    """Ask the running program to pause at its next statement boundary (any thread).

    ``action``: "exit" ends the process once the capsule is written; "continue" takes a
    checkpoint and carries on. If ``deadline`` seconds pass first, the pause is given up with a
    message; ``on_timeout="exit"`` then ends the process with :data:`EXIT_PAUSE_FAILED`.
    """
    controller().request_pause(reason, deadline, action, on_timeout)


def pause_status() -> dict[str, Any]:
    """Whether a pause is pending, for how long, and what it waits for."""
    return controller().status()
