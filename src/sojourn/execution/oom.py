"""Out of memory: an error that would end the program becomes a capsule it can be resumed from.

Every simple statement of the program (and every ``for``, for its ``__next__``) runs inside a
guard (see :mod:`transform`): ``try: S`` / ``except (MemoryError, RuntimeError):
__sojourn_oom__(sid); raise``. The guard of the *innermost* statement of the program's own
code that the error escapes from runs first, before anything around it has unwound, so its
frame and all its callers are exactly as a pause would find them. :func:`handle` then decides:

* the error must be an out-of-memory one: ``MemoryError`` (numpy's included), torch's
  ``OutOfMemoryError``, or a ``RuntimeError`` saying it could not allocate memory (torch on
  the CPU); anything else is re-raised untouched;
* every frame on the stack must be the program's own code at a resumable point (library code
  in between, e.g. ``nn.Module.__call__`` around a ``forward`` of the program, makes the
  guard decline; the error then reaches the guard of the statement that called the library,
  ``out = model(x)``, which is where the capsule is taken);
* one of those frames must be inside a loop (the issue's contract: a loop that runs out of
  memory midway; a statement outside any loop is not taken, as running a whole top-level
  call again could repeat work that already changed the program's objects);
* no ``try`` of the program around it may catch the error (the program handles it itself);
* no autograd graph may be live (the statement that built it re-runs instead, one level up).

When it captures, the program's own callback ``on_oom(error)`` runs first (the CLI raises a
soft memory limit there), then the frames that the error went through below the failing
statement are cleared and collected (their half-built temporaries are freed; CUDA's cache is
emptied), and the capsule is written with the failing statement as the frame's position, so
resume runs it **again from its start**; callers are re-entered, not re-run. The process
exits with :data:`EXIT_OOM`. A small emergency mapping is held while the program runs and
unmapped before the capture, so that the capture has room under a hard memory limit.
"""

from __future__ import annotations

import gc
import mmap
import os
import sys
import threading
import time
import traceback
import types
from typing import TYPE_CHECKING, Any

from sojourn.execution.pause import EXIT_OOM
from sojourn.execution.position import Deferred, Refused

if TYPE_CHECKING:
    from sojourn.execution.pause import PauseController
    from sojourn.execution.runtime import TransformedModule

DEFAULT_RESERVE = 32 << 20
STACK = 1 << 20  # stack of a thread started during an out-of-memory capture (the default is 8 MiB)


def is_oom(exc: BaseException | None) -> bool:
    if isinstance(exc, MemoryError):
        return True
    if not isinstance(exc, RuntimeError):
        return False
    torch = sys.modules.get("torch")
    oom_type = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
    if isinstance(oom_type, type) and isinstance(exc, oom_type):
        return True
    msg = str(exc)[:400].lower()
    return "can't allocate memory" in msg or "out of memory" in msg


class Reserve:
    """Address space held back for the capture: a private anonymous mapping, never touched, so
    it costs no physical memory but counts against ``RLIMIT_DATA``/``RLIMIT_AS``."""

    def __init__(self) -> None:
        self.size = 0
        self._map: mmap.mmap | None = None

    def hold(self, size: int) -> None:
        self.size = size
        self.acquire()

    def acquire(self) -> None:
        if self._map is None and self.size > 0:
            try:
                self._map = mmap.mmap(-1, self.size, flags=mmap.MAP_PRIVATE)
            except (OSError, ValueError, MemoryError):
                self._map = None

    def release(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None

    @property
    def held(self) -> bool:
        return self._map is not None


RESERVE = Reserve()


def reserve_size() -> int:
    value = os.environ.get("SOJOURN_OOM_RESERVE")
    try:
        return max(0, int(value)) if value else DEFAULT_RESERVE
    except ValueError:
        return DEFAULT_RESERVE


def _raised_by_next(tm: TransformedModule, sid: int, frame: types.FrameType, exc: BaseException) -> bool:
    """For a ``for`` guard: whether the loop's own ``__next__`` raised (not its body)."""
    from sojourn.execution.runtime import RUNTIME

    tb = exc.__traceback__
    while tb is not None and tb.tb_frame is not frame:
        tb = tb.tb_next
    info = RUNTIME.scope_of(frame.f_code)
    if tb is None or info is None:
        return False
    pos = span_at_offset(frame.f_code, tb.tb_lasti)
    site = tm.layout.sites.get((info[1], pos)) if pos is not None else None
    return site is not None and site.kind == "foriter" and site.sid == sid


def span_at_offset(code: types.CodeType, lasti: int) -> tuple[int, int, int, int] | None:
    from sojourn.execution.position import positions

    pos = positions(code)
    i = lasti // 2
    if not 0 <= i < len(pos) or pos[i][0] is None:
        return None
    return tuple(pos[i])  # type: ignore[return-value]


def _why_not_here(ctl: PauseController, pos: Any) -> str | None:
    rt = ctl.rt
    layouts = [(rt.modules[r.module].layout, r) for r in pos.records]
    guarded = [r for layout, r in layouts if layout.guarded(r.sid)]
    if guarded:
        return f"the program handles it itself (a try statement around {guarded[-1].where} may catch it)"
    # A `for` itself (its __next__ failed) counts as inside its loop.
    if not any(layout.in_loop(r.sid) or layout.stmts[r.sid].kind == "For" for layout, r in layouts):
        return (f"the failing statement ({pos.records[-1].where}) is not inside a loop of the program, "
                "so there is nothing to carry on from")
    return None


def _free(exc: BaseException, frame: types.FrameType) -> None:
    """Free what the failing statement had built: the frames it went through (library code
    and the program's own callees) hold its half-made temporaries."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame is not frame:
        tb = tb.tb_next
    if tb is not None and tb.tb_next is not None:
        traceback.clear_frames(tb.tb_next)
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                torch.cuda.empty_cache()
        except Exception:  # a CUDA that cannot be asked frees nothing
            pass


def _summary(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0][:200] if text else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def handle(ctl: PauseController, tm: TransformedModule, sid: int, frame: types.FrameType, header: bool) -> None:
    """Called by the guard of statement ``sid`` while an exception escapes it. Returns (and the
    guard re-raises) unless the program is paused here: then the process exits."""
    exc = sys.exc_info()[1]
    if exc is None or not is_oom(exc):
        return
    if threading.get_ident() != ctl.main_thread:
        return
    if not ctl.enabled or ctl.busy:
        _note(ctl, exc, "sojourn was " + ("busy (a pause, check or scan was under way)" if ctl.busy else "not running"))
        return
    if header and not _raised_by_next(tm, sid, frame, exc):
        return
    ctl.busy = True
    try:
        _attempt(ctl, tm, sid, frame, exc)
    finally:
        ctl.busy = False


def _attempt(ctl: PauseController, tm: TransformedModule, sid: int, frame: types.FrameType, exc: BaseException) -> None:
    from sojourn.execution import checkpoint as cap
    from sojourn.execution.pause import _Request

    RESERVE.release()
    t0 = time.perf_counter()
    try:
        pos = cap.position_at(ctl.rt, frame, sid)
        why = _why_not_here(ctl, pos)
        if why is not None:
            raise Deferred(why)
        try:
            cap.check_autograd(ctl.rt, pos)
        except Deferred as d:
            raise Deferred(f"an autograd graph is live, which a capsule cannot carry ({d}); the statement "
                           "that built it must run again, which happens when the forward and backward pass "
                           "run in a function called from the loop (a train_step())") from None
        cap.check_threads()
    except (Deferred, Refused) as e:
        _note(ctl, exc, str(e))
        RESERVE.acquire()
        return
    except MemoryError:
        _note(ctl, exc, "there was not even memory to find where the program was")
        return
    summary = _summary(exc)
    if ctl.config.on_oom is not None:
        try:
            ctl.config.on_oom(exc)
        except Exception as e:
            ctl.log(f"on_oom failed: {type(e).__name__}: {e}")
    _free(exc, frame)
    stack = threading.stack_size()
    req = _Request("oom", "exit", None, "exit", kind="oom")
    try:
        threading.stack_size(STACK)  # the capture's writer threads: 8 MiB stacks may not fit now
        event = cap.write_capsule(ctl.rt, pos, ctl.config, req, t0, low_memory=True)
    except Exception as e:
        from sojourn.errors import CaptureError

        reason = str(e) if isinstance(e, CaptureError) else f"{type(e).__name__}: {e}"
        _note(ctl, exc, f"the capsule could not be written: {reason}")
        RESERVE.acquire()
        return
    finally:
        threading.stack_size(stack)
    where = pos.records[-1].where
    # A statement further in declined first: say why, so a capsule positioned further out
    # than the allocation that failed is explained (it costs re-running the outer statement).
    inner = ctl.oom_notes.pop(id(exc), None)
    declined = f" (a statement further in declined: {inner})" if inner else ""
    ctl.landed(event, EXIT_OOM,
               f"out of memory at {where} ({summary}); capsule {event.capsule} ({event.size} bytes, written in "
               f"{event.seconds_capture * 1e3:.0f} ms) is positioned before that statement, which runs again on "
               f"resume: resume it with more memory to carry on{declined}")


def _note(ctl: PauseController, exc: BaseException, why: str) -> None:
    if len(ctl.oom_notes) > 64:  # a program that handles its own errors in a loop makes many
        ctl.oom_notes.clear()
    ctl.oom_notes[id(exc)] = why


def report_uncaptured(ctl: PauseController, exc: BaseException) -> None:
    """The program ends with an out-of-memory error no guard could capture: say why."""
    if not is_oom(exc):
        return
    note = ctl.oom_notes.get(id(exc))
    if note is None:
        note = "it was not raised by a statement of the program that sojourn can resume"
    ctl.log(f"out of memory ({_summary(exc)}); no capsule was written: {note}")


__all__ = ["EXIT_OOM", "RESERVE", "handle", "is_oom", "report_uncaptured"]
