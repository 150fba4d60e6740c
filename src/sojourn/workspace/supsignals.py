"""The supervisor's signals (a part of :class:`~sojourn.workspace.supervisor.Supervisor`).

The main thread of ``sojourn run``/``resume`` waits for the session and forwards signals to it:
SIGTERM and SIGUSR1 as they are, SIGHUP as SIGTERM (a closed terminal pauses the program),
SIGINT (Ctrl-C) as a pause with reason ``interrupt``, a second one within
:data:`INTERRUPT_WINDOW` seconds as SIGINT itself (``KeyboardInterrupt`` in the program).
Signals that came while the command started up (``held.py``) are served the same way once
these handlers are in place; before the session said ``started`` a pause signal goes over the
control pipe (the session would not survive it yet).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any

from sojourn import threads
from sojourn.workspace import held

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)
# What the engine does with a signal (execution.pause.PauseConfig.signals): (deadline, at the
# deadline). Asked over the control pipe while the session has not said it started.
ENGINE_SIGNALS: dict[int, tuple[float, str]] = {signal.SIGTERM: (30.0, "exit"), signal.SIGUSR1: (120.0, "continue")}
INTERRUPT_WINDOW = 3.0  # a second Ctrl-C within this many seconds interrupts the program instead


class SignalForwarding:
    """Mixed into the Supervisor, whose attributes it uses (proc, started, notices, pending,
    status_msg, on_output, _lock, _control, append, spec)."""

    proc: Any
    started: bool
    notices: Any
    pending: dict[str, Any] | None
    status_msg: dict[str, Any] | None
    on_output: Any
    _lock: threading.Lock
    _interrupted: float | None = None  # when the last Ctrl-C asked for a pause (monotonic)
    spec: Any

    def _control(self, msg: dict[str, Any]) -> None:
        raise NotImplementedError

    def append(self, *events: dict[str, Any]) -> None:
        raise NotImplementedError


    def _install_signals(self) -> dict[int, Any]:
        if threading.current_thread() is not threading.main_thread():
            return {}
        old: dict[int, Any] = {}
        for sig in FORWARDED:
            old[sig] = signal.signal(sig, self._forward)
        for noted in held.take():  # came while this command started up (held.py)
            self._forward(noted, None)
        return old

    def _restore_signals(self, old: dict[int, Any]) -> None:
        for sig, handler in old.items():
            signal.signal(sig, handler)

    def _forward(self, signum: int, frame: Any) -> None:
        if self.notices is not None and self.notices.signal(signum):
            return  # issue 6: a notice (Slurm's --signal, Kubernetes' SIGTERM); _on_notice pauses
        if signum == signal.SIGINT:
            self._interrupt()
            return
        target = signal.SIGTERM if signum == signal.SIGHUP else signum
        if signum == signal.SIGHUP:
            self.on_output = None  # the terminal is gone
        if not self.started and target in ENGINE_SIGNALS:
            # The session holds these signals from its first line (held.py) and says
            # `started` then; before that, one would kill it: ask for the same pause instead.
            deadline, on_timeout = ENGINE_SIGNALS[target]
            self._control({"op": "pause", "reason": held.name(target), "deadline": deadline, "action": "exit",
                           "on_timeout": on_timeout})
            return
        p = self.proc
        if p is not None and p.returncode is None:
            try:
                os.kill(p.pid, target)
            except ProcessLookupError:
                pass

    def _interrupt(self) -> None:
        """Ctrl-C in the terminal suspends the program at its next statement; a second one
        within :data:`INTERRUPT_WINDOW` seconds passes ``KeyboardInterrupt`` to it, as plain
        Python would (the session's engine then drops the pending pause)."""
        now = time.monotonic()
        p = self.proc
        if self._interrupted is not None and now - self._interrupted <= INTERRUPT_WINDOW:
            self._interrupted = None
            with self._lock:
                self.pending = None
            print("sojourn: Ctrl-C again: interrupting the program (KeyboardInterrupt)", file=sys.stderr, flush=True)
            if p is not None and p.returncode is None:
                try:
                    os.kill(p.pid, signal.SIGINT)
                except ProcessLookupError:
                    pass
            return
        self._interrupted = now
        print(f"sojourn: Ctrl-C: suspending the program at its next statement (Ctrl-C again within "
              f"{INTERRUPT_WINDOW:g} s interrupts it instead)", file=sys.stderr, flush=True)
        with self._lock:
            self.pending = {"n": None, "kind": "interrupt", "t": time.monotonic()}
        self.status_msg = None
        self._control({"op": "pause", "reason": "interrupt", "deadline": None, "action": "exit",
                       "on_timeout": "continue"})
        # Recorded from a thread: a signal handler must not wait on the repository.
        # Without a thread (`ulimit -v`) it goes unrecorded: the pause itself is asked already.
        threads.start_or_skip(self._record_request, "interrupt", "Ctrl-C", name="sojourn-interrupt")

    def _record_request(self, kind: str, by: str) -> None:
        try:
            self.append({"type": "request", "n": None, "kind": kind, "requested_by": by})
        except Exception as e:  # the repository hiccuped: the pause itself is asked already
            print(f"sojourn: supervisor of {self.spec.workspace}: {e}", file=sys.stderr)

