"""Threads that still start under a tight address-space limit (``ulimit -v``).

A thread's stack reserves ``RLIMIT_STACK`` (8 MiB by default) of address space, and glibc
gives each new thread a malloc arena of 64 MiB more. Under a limit as tight as the program
itself can live with, ``Thread.start()`` raises ``RuntimeError: can't start new thread``
(or MemoryError), and a capture, a pause or a write check that needs a thread then lost the
capsule. Here a refused start is tried once more with a small stack, and where even that is
refused the caller does the work inline (``start`` returns False; ``Executor`` runs the job
on the submitting thread). It is said once on stderr, since the program runs slower so.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

# Enough for what sojourn's threads do (hashing, compressing, writing, waiting on a child);
# the deep pickler asks for its own, big, stack and falls back to the caller's.
SMALL_STACK = 512 << 10
_said = threading.Event()
_stack_lock = threading.Lock()  # threading.stack_size is process-wide: one retry at a time


def refused_once(what: str) -> None:
    """Say once per process that threads could not be started and why it still works."""
    if _said.is_set():
        return
    _said.set()
    print(f"sojourn: a thread could not be started ({what}; an address-space limit such as `ulimit -v`?): "
          "work that must be done is done on the calling thread (slower), background watchers are left out",
          file=sys.stderr, flush=True)


def start(t: threading.Thread) -> threading.Thread | None:
    """``t.start()``; where the system refuses a thread, once more with a small stack. The
    thread that runs ``t``'s work (``t`` or its copy), or None: no thread could be started
    (the caller does the work itself, or does without it)."""
    try:
        t.start()
        return t
    except (RuntimeError, MemoryError) as e:
        first = e
    with _stack_lock:
        old = threading.stack_size()
        try:
            threading.stack_size(SMALL_STACK)
            # A Thread object can be started once only: the retry starts a copy of it.
            retry = threading.Thread(target=t.run, name=t.name, daemon=t.daemon)
            retry.start()
            return retry
        except (RuntimeError, MemoryError, ValueError):
            pass
        finally:
            threading.stack_size(old)
    refused_once(f"{t.name}: {first}")
    return None


def start_or_run(target: Callable[..., Any], *args: Any, name: str) -> threading.Thread | None:
    """Run ``target(*args)`` on a daemon thread, or, where none can be started, right here
    (then None is returned, with the work done)."""
    t = start(threading.Thread(target=target, args=args, name=name, daemon=True))
    if t is None:
        target(*args)
    return t


def start_or_skip(target: Callable[..., Any], *args: Any, name: str) -> bool:
    """Run ``target(*args)`` on a daemon thread; where none can be started, not at all (for a
    watcher whose work must not block the caller: an early warning, a periodic scan)."""
    return start(threading.Thread(target=target, args=args, name=name, daemon=True)) is not None


class Executor(ThreadPoolExecutor):
    """A ThreadPoolExecutor whose jobs still run when no worker thread can be started: by
    the workers it has, or, with none at all, on the submitting thread."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        f = super().submit(fn, *args, **kwargs)
        if not self._threads:
            # Outside submit's locks: a job run here may submit more (a buffer's chunks).
            self._run_queued()
        return f

    def _adjust_thread_count(self) -> None:
        try:
            super()._adjust_thread_count()  # type: ignore[misc]
            return
        except (RuntimeError, MemoryError) as e:
            first = e
        with _stack_lock:
            old = threading.stack_size()
            try:
                threading.stack_size(SMALL_STACK)
                super()._adjust_thread_count()  # type: ignore[misc]
                return
            except (RuntimeError, MemoryError, ValueError):
                pass
            finally:
                threading.stack_size(old)
        # The job waits in the queue: for a worker there is, or for submit() to run it.
        refused_once(f"{self._thread_name_prefix}: {first}")

    def _run_queued(self) -> None:
        import queue

        q: Any = self._work_queue  # type: ignore[attr-defined]
        while True:
            try:
                item = q.get_nowait()
            except queue.Empty:
                return
            if item is None:
                continue
            ctx = getattr(self, "_create_worker_context", None)  # 3.14 hands a context to run()
            if ctx is not None:
                item.run(ctx())
            else:
                item.run()


def limited() -> bool:
    """Whether this process runs under a finite address-space limit."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return soft != resource.RLIM_INFINITY


def lift_soft_limit() -> None:
    """Raise this process's soft address-space limit to its hard one (a preexec_fn)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_AS, (hard, hard))


def session_env(env: dict[str, str]) -> dict[str, str]:
    """The environment of a session started under an address-space limit: few malloc arenas
    (glibc reserves 64 MiB of address space for each thread's own arena; two leave the limit
    to the program), unless the user chose their own."""
    if "MALLOC_ARENA_MAX" in env or not limited() or not sys.platform.startswith("linux"):
        return env
    return {**env, "MALLOC_ARENA_MAX": os.environ.get("SOJOURN_MALLOC_ARENA_MAX", "2")}
