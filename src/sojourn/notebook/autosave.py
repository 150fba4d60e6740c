"""Autosave: a capsule after every cell, written in the background.

How "background" works, and why this way: after a cell, the kernel forks. The child is a
copy-on-write snapshot of the kernel at a cell boundary: it pickles the namespace, hashes
every chunk and writes only the new ones (``capture(parent=...)`` and the chunk store's
content addressing make it incremental), then reports over a pipe and exits. The kernel
goes on at once: the cell's blocking time is the ``fork()`` itself (page tables, not
memory: a few ms for a GiB). The alternatives, measured in bench/bench_notebook.py:

* capturing in the kernel's own thread blocks for the whole pickle + hash + write (about a
  second per GiB here);
* a capture thread is not a snapshot: the next cell would mutate arrays while they are
  being hashed, so the capsule could mix two states; copying first costs the same as
  capturing.

Fork hazards, and what the child does about each:

* other threads (ipykernel's IOPub, shell-channel, control and heartbeat threads, IPython's
  history thread, torch's pool) do not exist in the child; locks they held stay held. The
  child never touches zmq, IPython's history database or logging handlers, uses its own
  repository handle (fresh chunk-store threads) and runs torch single-threaded;
* inherited descriptors: the child closes every descriptor but its result pipe first, so
  the kernel's sockets (its ports) are never held by a child that outlives a move, and its
  stdout never reaches the notebook;
* the child ends with ``os._exit``: no atexit handler (zmq's context term would hang);
* a failure (an object that cannot travel, a full disk, a crash, a timeout) is reported to
  the kernel, which prints why after the next cell and in ``%sojourn status``; the kernel
  itself is never affected. One cell's autosave at a time: a cell that ends while the
  previous autosave still runs is saved as soon as that one ends, at the next idle moment.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

CHILD_TIMEOUT = float(os.environ.get("SOJOURN_AUTOSAVE_TIMEOUT", "600"))


@dataclass
class SaveResult:
    ok: bool
    capsule: str | None = None
    parent: str | None = None
    size: int = 0
    bytes_written: int = 0
    chunks_new: int = 0
    seconds: float = 0.0  # the capture, in the background
    blocking: float = 0.0  # what the kernel waited for (fork)
    cell: int = 0
    error: str | None = None
    notes: list[str] = field(default_factory=list)


class Autosaver:
    """Runs one background capture at a time. ``capture_in_child(parent)`` runs in the
    forked child and returns a dict for :class:`SaveResult`; ``on_done(result)`` runs in a
    watcher thread of the kernel."""

    def __init__(self, capture_in_child: Callable[[str | None], dict[str, Any]],
                 on_done: Callable[[SaveResult], None], schedule: Callable[[Callable[[], None]], None] | None):
        self.capture_in_child = capture_in_child
        self.on_done = on_done
        self.schedule = schedule  # runs a callback on the kernel's main thread when idle
        self.enabled = False
        self.head: str | None = None  # the capsule the next one is incremental to
        self.child: int | None = None
        self.pending = False
        self.pending_cell = 0
        self.in_cell = False
        self.last: SaveResult | None = None
        self.history: list[SaveResult] = []
        self._lock = threading.Lock()
        self._done = threading.Condition(self._lock)

    # -- the kernel's side -------------------------------------------------------------------

    def after_cell(self, cell: int) -> float | None:
        """Start a background capture now; returns the blocking seconds, or None when one is
        still running (this state is saved when it ends)."""
        with self._lock:
            if self.child is not None:
                self.pending, self.pending_cell = True, cell
                return None
            self.pending = False
        return self._fork(cell)

    def _fork(self, cell: int) -> float:
        t0 = time.perf_counter()
        r, w = os.pipe()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: "multi-threaded fork"
            pid = os.fork()
        if pid == 0:  # the child: never returns
            os.close(r)
            _child_main(w, self.capture_in_child, self.head)
        os.close(w)
        blocking = time.perf_counter() - t0
        with self._lock:
            self.child = pid
        threading.Thread(target=self._watch, args=(pid, r, blocking, cell, self.head),
                         name="sojourn-autosave", daemon=True).start()
        return blocking

    def _watch(self, pid: int, r: int, blocking: float, cell: int, parent: str | None) -> None:
        deadline = time.monotonic() + CHILD_TIMEOUT
        chunks = []
        timed_out = False
        import selectors

        with selectors.DefaultSelector() as sel:
            sel.register(r, selectors.EVENT_READ)
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    timed_out = True
                    break
                if not sel.select(min(left, 1.0)):
                    continue
                data = os.read(r, 1 << 16)
                if not data:
                    break
                chunks.append(data)
        os.close(r)
        if timed_out:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        _, status = os.waitpid(pid, 0)
        raw = b"".join(chunks)
        try:
            doc = json.loads(raw) if raw else None
        except ValueError:
            doc = None
        if doc is None:
            why = (f"it took longer than {CHILD_TIMEOUT:.0f} s and was stopped" if timed_out
                   else f"the saving process ended without a result ({_status(status)})")
            result = SaveResult(False, parent=parent, blocking=blocking, cell=cell, error=why)
        else:
            result = SaveResult(**{**doc, "blocking": blocking, "cell": cell, "parent": parent})
        try:
            self.on_done(result)  # records the capsule event; may fail on a broken repository
        except Exception as e:
            result.ok, result.error = False, f"the capsule was written but not recorded: {type(e).__name__}: {e}"
        with self._lock:
            if result.ok and result.capsule:
                self.head = result.capsule
            self.last = result
            self.history.append(result)
            self.child = None
            again = self.pending and self.enabled
            self._done.notify_all()
        if again and self.schedule is not None:
            self.schedule(self._idle_save)

    def _idle_save(self) -> None:
        # On the kernel's main thread between cells (an async cell may yield mid-cell:
        # then the next after_cell saves it).
        if self.in_cell or not self.enabled:
            return
        with self._lock:
            if self.child is not None or not self.pending:
                return
            self.pending = False
        self._fork(self.pending_cell)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until no background capture runs (before a move or a checkpoint)."""
        end = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while self.child is not None:
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._done.wait(left)
        return True


def _status(status: int) -> str:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        return f"killed by {name}" + (" - out of memory?" if sig == signal.SIGKILL else "")
    return f"exit code {os.WEXITSTATUS(status)}"


def _child_main(w: int, capture: Callable[[str | None], dict[str, Any]], parent: str | None) -> None:
    code = 0
    try:
        os.closerange(3, w)
        os.closerange(w + 1, 1 << 16)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115
        gc.disable()  # a collection would touch (and copy) every object's page
        torch = sys.modules.get("torch")
        if torch is not None:
            torch.set_num_threads(1)  # its pool's threads are not in this process
        t0 = time.perf_counter()
        try:
            doc = capture(parent)
            doc.setdefault("seconds", time.perf_counter() - t0)
        except BaseException as e:
            doc = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        os.write(w, json.dumps(doc).encode())
    except BaseException:
        code = 70
    finally:
        os._exit(code)
