"""Signals held from the first line of a process, until the code that serves them is ready.

``sojourn run``/``resume``, a detached supervisor and the session process each call
:func:`hold` before their imports: a SIGTERM (a machine going away, a CI runner stopping a
job) that arrives while they start up is noted instead of killing the process, and served
once its handler is installed (:func:`take`): the supervisor forwards it, the session makes it
a pause request. Without this, a signal during the first few hundred milliseconds was "the
session was killed by SIGTERM", with nothing to resume.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

_HELD: list[int] = []
_LOCK = threading.Lock()
_SIGNALS: tuple[int, ...] = ()


def _note(signum: int, frame: Any) -> None:
    if signum == signal.SIGINT and signum in _HELD:
        # Ctrl-C twice while nothing serves it yet (a launch still waiting for a machine):
        # the user means it.
        _HELD.remove(signum)
        raise KeyboardInterrupt
    _HELD.append(signum)  # list.append is atomic; a handler must not take a lock the main thread holds


def hold(signals: tuple[int, ...]) -> None:
    """Note ``signals`` from now on instead of acting on them (main thread only)."""
    global _SIGNALS
    if threading.current_thread() is not threading.main_thread():
        return
    for s in signals:
        signal.signal(s, _note)
    _SIGNALS = tuple(signals)


def holding(signum: int) -> bool:
    """Whether ``signum`` is still noted here (nobody installed its own handler yet)."""
    return signum in _SIGNALS and signal.getsignal(signum) is _note


def take() -> list[int]:
    """The signals noted so far, oldest first; they are forgotten here."""
    with _LOCK:
        out = list(_HELD)
        del _HELD[: len(out)]
    return out


def release(signum: int) -> None:
    """Give ``signum`` back its default behaviour, if it is still noted here."""
    if holding(signum):
        signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)


def name(signum: int) -> str:
    return signal.Signals(signum).name
