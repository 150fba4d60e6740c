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

from sojourn import threads
from sojourn.errors import Problem
from sojourn.execution.position import CO_COROUTINE, Deferred, Refused, describe_frame
from sojourn.execution.runtime import RUNTIME, Runtime, TransformedModule

EXIT_PAUSED = 75  # a capsule was written; `resume` carries on (EX_TEMPFAIL)
EXIT_PAUSE_FAILED = 76  # a pause had to be taken (SIGTERM) but could not be before its deadline
EXIT_OOM = 77  # out of memory inside a loop: a capsule positioned before the failing statement (see oom)

# While a pause is deferred, no attempt is made before what deferred it returned
# (PauseController._defer).
DEFER_MAX_WAIT = 0.25  # with a barrier frame, polled every BARRIER_POLL s
BARRIER_POLL = 0.001
HOT_CHECKS = 64  # checks in a row that found the barrier holding, before the watchdog polls instead

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
    checked: bool = False  # the write check (PauseConfig.verify) passed before the process ended


@dataclass(frozen=True)
class PauseRefusal:
    reason: str
    message: str
    problems: tuple[Problem, ...] = ()
    capsule: str | None = None  # a capsule was written but failed its write check (marked failed)
    error: str | None = None  # ... and why


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
    # While deferred, the flag is off until then (perf_counter): see PauseController._defer.
    rearm_at: float | None = None
    barrier: types.FrameType | None = None  # no attempt while it holds (Deferred.barrier)
    lasti: int | None = None
    held: int = 0  # checks in a row that found the barrier holding
    checks: int = 0  # statements of the program reached since the request


@dataclass
class PauseConfig:
    repo: Any = None
    # The id of the repository at ``repo`` when the program started (runner._config): a pause
    # writes into that repository only, never into a new one where it used to be.
    repo_id: str | None = None
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
    # The write check of a capsule that ends the process, run while the program waits at its
    # statement boundary: (capsule id, seconds left before the request's deadline or None)
    # -> None when the capsule restores in a fresh interpreter with every fingerprint equal,
    # else why not (the pause is then refused and the program keeps running); raises
    # TimeoutError when it could not finish in the time left (the capsule is kept, unchecked).
    verify: Callable[[str, float | None], str | None] | None = None


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
        self._switch: float | None = None  # the GIL's switch interval, while a deferral polls
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
        """Gives up a request whose deadline passed, and turns the flag back on for a deferred
        one when its wait is over (:meth:`_defer`). Woken by :meth:`_watch`."""
        while True:
            req = self.request
            if req is None or req.done.is_set():
                if req is not None:
                    req.barrier = None  # a frame holds its locals alive
                self._switch_back()
                self._wake.wait()
                self._wake.clear()
                continue
            now = time.perf_counter()
            wait = 0.1
            if req.deadline is not None:
                left = req.t0 + req.deadline - now
                if left <= 0:
                    self._timeout(req)
                    continue
                wait = min(wait, left)
            rearm = req.rearm_at
            if rearm is not None:
                if rearm <= now or self._returned(req):
                    req.rearm_at = None
                    self._switch_back()
                    if not req.done.is_set():
                        self.rt.set_flag(True)
                    continue
                wait = min(wait, rearm - now, BARRIER_POLL if req.barrier is not None else wait)
            self._wake.wait(wait)
            self._wake.clear()

    def _timeout(self, req: _Request) -> None:
        with self.lock:
            if req.done.is_set():
                return
            why = self._barrier_words(req) or req.last_deferral or self.where_main()
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

    def _barrier_words(self, req: _Request) -> str | None:
        """What a deferred pause still waited for at its deadline, in the program's terms:
        the call of the program's own code that had not returned."""
        b = req.barrier
        if b is None or not self._holds(req, sys._current_frames().get(self.main_thread or 0)):
            return None
        if req.lasti is not None:  # the program's frame, waiting in a call made for it by other code
            return (f"the program was still in the call at {b.f_code.co_filename}:{b.f_lineno} "
                    f"(in {b.f_code.co_qualname}), through library or C code (map(), sorted(key=...), a "
                    "comprehension...), which had not returned; a pause lands only at the program's own statements")
        caller = b.f_back
        while caller is not None and self.rt.scope_of(caller.f_code) is None:
            caller = caller.f_back
        at = f", called from {caller.f_code.co_filename}:{caller.f_lineno}" if caller is not None else ""
        what = "a comprehension" if b.f_code.co_name.startswith("<") else f"{b.f_code.co_qualname}()"
        return (f"the program was still inside {what} ({b.f_code.co_filename}:{b.f_lineno}){at}, which had "
                "not returned; a pause lands only at the program's own statements")

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
        req.checks += 1
        if self.skip:
            self.skip -= 1
            return
        if req.barrier is not None:
            if self._holds(req, frame):  # still waiting for the library code to return (_defer)
                req.held += 1
                if req.held >= HOT_CHECKS:
                    self._poll(req)
                return
            req.barrier = None
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
            self._defer(req, d)
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
        if event.action == "exit" and self.config.verify is not None:
            checked = self._check(req, event)
            if checked is None:
                return
            event = checked
        if event.action == "exit":
            self.landed(event, EXIT_PAUSED,
                        f"paused ({event.reason}, {event.seconds_to_pause * 1e3:.2f} ms after the request) at "
                        f"{event.where}; capsule {event.capsule} ({event.size} bytes, written in "
                        f"{event.seconds_capture * 1e3:.0f} ms); resume it to carry on")
        self.landed(event, None, f"checkpoint {event.capsule} at {event.where}")
        req.done.set()
        self.rt.set_flag(False)

    def _check(self, req: _Request, event: PauseEvent) -> PauseEvent | None:
        """The write check, before the process ends: the event, marked checked (or not, when
        the deadline left no time for it), or None when the capsule failed it: then the pause
        is refused, the capsule is marked failed, and the program carries on from this
        statement, as if no pause had been asked. No pause ends a job."""
        import dataclasses

        assert self.config.verify is not None
        left = None if req.deadline is None else req.deadline - (time.perf_counter() - req.t0)
        if left is not None and left <= 0.5:
            self._log(f"no time left for the write check of {event.capsule} before the deadline; "
                      "it is checked when it is recorded")
            return event
        try:
            error = self.config.verify(event.capsule, left)
        except TimeoutError:
            self._log(f"the write check of {event.capsule} did not finish before the deadline; "
                      "it is checked when it is recorded")
            return event
        except Exception as e:
            error = f"the check could not run: {type(e).__name__}: {e}"
        if error is None:
            return dataclasses.replace(event, checked=True)
        self._give_up(req, PauseRefusal(req.reason, f"capsule {event.capsule} failed its write check, so it was "
                                        f"not used: {error}", capsule=event.capsule, error=error))
        return None

    def _defer(self, req: _Request, d: Deferred) -> None:
        """Keep a deferred program fast. A library loop calling back into the program passes
        a check at every callback; an attempt at each of them (a walk over the stack) made
        it run 30-300 times slower.

        With a barrier (``Deferred.barrier``: until when nothing can land), the next checks
        only look whether it still holds (:meth:`_holds`, a few frames up) and the pause is
        attempted at the first check after it stopped holding: the program's first pause
        point after the library code or the comprehension returned. When checks come often
        (:data:`HOT_CHECKS` in a row held), even that is too much: the flag goes off (checks
        cost nothing again) and the watchdog thread looks at the main thread's stack every
        :data:`BARRIER_POLL` seconds instead, turning the flag on once the barrier stopped
        holding (at the latest after :data:`DEFER_MAX_WAIT`); the pause then lands a
        millisecond or so after the return. Without a barrier (a live autograd graph, an
        expression of the program's own code), every check attempts again, as the pause
        may land at the next statement. Measured in ``bench/bench_execution.py`` ("while a
        pause waits")."""
        req.barrier, req.lasti, req.held = d.barrier, d.lasti, 0

    def _poll(self, req: _Request) -> None:
        """Checks come too often to look at each: the flag off, the watchdog polls."""
        req.held = 0
        if self._switch is None:
            # The watchdog polls every millisecond; the main thread, running the program,
            # hands it the GIL only after the switch interval (5 ms by default).
            self._switch = sys.getswitchinterval()
            sys.setswitchinterval(min(self._switch, BARRIER_POLL / 2))
        req.rearm_at = time.perf_counter() + DEFER_MAX_WAIT
        self.rt.set_flag(False)
        self._wake.set()

    def _switch_back(self) -> None:
        if self._switch is not None:
            sys.setswitchinterval(self._switch)
            self._switch = None

    @staticmethod
    def _holds(req: _Request, frame: types.FrameType | None) -> bool:
        """Whether the barrier of ``req`` still holds with ``frame`` innermost: its frame is
        on the stack and (with ``lasti``) waits in the same call, called from a frame above."""
        b = req.barrier
        if b is None:
            return False
        f = frame
        while f is not None:
            if f is b:
                return req.lasti is None or (f is not frame and f.f_lasti == req.lasti)
            f = f.f_back
        return False

    def _returned(self, req: _Request) -> bool:
        """Whether the barrier of ``req`` stopped holding on the main thread's stack."""
        if req.barrier is None:
            return False
        return not self._holds(req, sys._current_frames().get(self.main_thread or 0))

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

    def ended(self) -> None:
        """The program's last statement returned while a pause was asked for: say so, with
        whether it reached any statement of its own after the request (if not, the request
        came too late for any pause; if it did, what the pause waited for)."""
        with self.lock:
            req = self.request
            if req is None or req.done.is_set() or req.kind != "pause":
                return
            req.done.set()
            self.rt.set_flag(False)
        ago = time.perf_counter() - req.t0
        if req.checks == 0:
            why = "it reached no statement of its own after the request (the request came too late)"
        else:
            why = f"the pause still waited: {req.last_deferral or self.where_main()}"
        self._log(f"the program ended {ago:.2f} s after a pause was asked for ({req.reason}), no capsule "
                  f"written: {why}; it finished, nothing is lost")

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
        # runs on (checkpoint.py).
        cap.rehearse_in_background(self.rt, pos, self._warn_scan, self._log)

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
        if not threads.start_or_skip(self._watchdog, name="sojourn-deadline"):
            self._log("warning: no thread for pause deadlines could be started; a pause waits for its "
                      "statement boundary however long it takes")
        for signum, (action, deadline, on_timeout) in self.config.signals.items():
            name = signal.Signals(signum).name

            def handler(s: int, f: Any, name: str = name, action: str = action,
                        deadline: float | None = deadline, on_timeout: str = on_timeout) -> None:
                self.request_pause(name, deadline, action, on_timeout)

            signal.signal(signum, handler)
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, self._on_sigint)
        if self.config.scan_interval:
            threads.start_or_skip(self._scan_loop, name="sojourn-scan")  # an early warning: none without

    def _on_sigint(self, signum: int, frame: Any) -> None:
        """Python's own ``KeyboardInterrupt``, after dropping a pause that a first Ctrl-C
        asked for (reason ``interrupt``, from the supervisor): a second Ctrl-C means
        "interrupt the program", not "and then suspend it"."""
        req = self.request
        if req is not None and req.reason == "interrupt" and not req.done.is_set():
            req.done.set()
            self.rt.set_flag(False)
            self._log("pause dropped: Ctrl-C again, the program gets KeyboardInterrupt")
        raise KeyboardInterrupt

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
