"""Repository locks that keep ``gc`` and captures apart (see docs/history-and-gc.md).

A capture decides, chunk by chunk, to write or to *skip* a chunk because it is already there
(deduplication), and only names those chunks in its manifest at the very end. Until then
nothing in the repository says the skipped chunks are needed, so a garbage collector that
ran in between could delete them. Like restic, captures therefore hold a **shared** lock
from their first chunk decision until their manifest is stored, and gc holds an
**exclusive** one while it decides and deletes. Both live in the repository's ``locks``
kind, so they work across processes and hosts, on every backend:

``capture.<uuid>``   one per capture in flight; written by its owner, removed at the end
``gc.<n:08d>``       the n-th gc run; created exclusively (the compare-and-swap: one gc
                     wins ``n``), ``state`` "held" while it runs, then "released"

The handshake is a two-flag protocol. A capture (1) waits until the newest ``gc.<n>`` is
not held, (2) writes its ``capture.<uuid>``, (3) looks at the newest ``gc.<n>`` again and,
if a gc took it meanwhile, removes its own lock and goes back to (1). A gc (a) creates
``gc.<n+1>`` exclusively, then (b) waits until no live ``capture.*`` is left. Every backend
here reads its own and others' completed writes (a local filesystem; S3 since 2020; Ceph
radosgw in one zone), so either the capture's write (2) comes before the gc's listing (b),
and the gc waits for it, or the listing comes before it, so the gc's create (a) comes before
the capture's second look (3), and the capture backs off. They are never both past the
handshake. Nothing is ever deleted by anyone but its owner except stale locks, so there is
no delete-then-recreate race on the ``gc.`` objects; the newest ``n`` is also the **gc
generation**, which tells a process that its in-memory "this chunk exists" cache may be
out of date (a gc ran since it was filled) and must be dropped.

A lock names its holder (host, boot id, pid and its start time) and is refreshed every
``refresh`` seconds by a thread. It is **stale** when its holder is provably gone (same
host: dead pid, reused pid, or another boot) or when it was not refreshed for
``stale_after`` seconds (another host: the clocks must agree to well within that). A stale
lock counts for nothing; gc removes stale capture locks it finds.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from sojourn import threads
from sojourn.errors import AlreadyExists, ObjectNotFound, RepositoryError
from sojourn.procs import alive, boot_id, hostname, me
from sojourn.repository.backend import Backend
from sojourn.repository.chunks import ChunkStore

KIND = "locks"
CAPTURE_PREFIX = "capture."
GC_PREFIX = "gc."
DEFAULT_STALE = 600.0


class LockBusy(RepositoryError):
    """The lock could not be taken in time; the message says who holds it."""


def stale_after() -> float:
    """Seconds without a refresh after which a lock of another host counts as abandoned
    (``$SOJOURN_LOCK_STALE``; default 600)."""
    try:
        return max(1.0, float(os.environ.get("SOJOURN_LOCK_STALE", DEFAULT_STALE)))
    except ValueError:
        return DEFAULT_STALE


def _refresh_interval() -> float:
    return max(0.2, min(60.0, stale_after() / 5))


def _poll_interval(backend: Backend) -> float:
    return 0.5 if type(backend).__name__ == "S3Backend" else 0.05


# -- who holds a lock -----------------------------------------------------------------------


def holder() -> dict[str, Any]:
    return me()


def why_stale(doc: dict[str, Any], now: float | None = None) -> str | None:
    """Why the lock ``doc`` no longer counts, or None while it does."""
    if doc.get("state", "held") != "held":
        return "released"
    if doc.get("host") == hostname():
        if doc.get("boot_id") and boot_id() and doc.get("boot_id") != boot_id():
            return "its host rebooted"
        pid = doc.get("pid")
        if isinstance(pid, int) and not alive(pid, doc.get("pid_start")):
            return f"its process (pid {pid}) is gone"
    age = (now if now is not None else time.time()) - float(doc.get("refreshed", 0.0))
    if age > stale_after():
        return f"not refreshed for {age:.0f} s"
    return None


def describe(doc: dict[str, Any]) -> str:
    return f"{doc.get('purpose', doc.get('kind', 'lock'))} by pid {doc.get('pid')} on {doc.get('host')}"


@dataclass
class LockInfo:
    name: str
    doc: dict[str, Any]
    stale: str | None


def _load(backend: Backend, name: str) -> dict[str, Any] | None:
    try:
        doc = json.loads(backend.load(KIND, name))
    except ObjectNotFound:
        return None
    except ValueError:
        return {"state": "held", "refreshed": 0.0}  # a torn or foreign object: stale by age
    return doc if isinstance(doc, dict) else None


def capture_locks(backend: Backend) -> list[LockInfo]:
    out = []
    now = time.time()
    for name in backend.list(KIND, CAPTURE_PREFIX):
        doc = _load(backend, name)
        if doc is not None:
            out.append(LockInfo(name, doc, why_stale(doc, now)))
    return out


def newest_gc(backend: Backend) -> tuple[int, dict[str, Any] | None]:
    """The gc generation (the newest ``gc.<n>``'s n, 0 before any gc) and that object."""
    best = 0
    for name in backend.list(KIND, GC_PREFIX):
        try:
            best = max(best, int(name[len(GC_PREFIX):]))
        except ValueError:
            continue
    if best == 0:
        return 0, None
    return best, _load(backend, f"{GC_PREFIX}{best:08d}")


def _gc_running(backend: Backend) -> tuple[int, dict[str, Any] | None]:
    """(generation, the doc of a gc that holds its lock now, or None)."""
    n, doc = newest_gc(backend)
    if doc is None or why_stale(doc) is not None:
        return n, None
    return n, doc


# -- a held lock ----------------------------------------------------------------------------


class HeldLock:
    """A lock object this process wrote, kept fresh by a thread until :meth:`release`."""

    def __init__(self, backend: Backend, name: str, doc: dict[str, Any], *, generation: int,
                 exclusive: bool):
        self.backend = backend
        self.name = name
        self.doc = doc
        self.generation = generation
        self.exclusive = exclusive
        self.lost: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start_refreshing(self) -> None:
        # No room for a thread even with a small stack (after an out-of-memory error, under
        # `ulimit -v`): the lock then only goes stale if this hold outlasts stale_after,
        # which a capture normally does not.
        self._thread = threads.start(threading.Thread(target=self._refresh_loop, name=f"sojourn-lock-{self.name}",
                                                      daemon=True))

    def _refresh_loop(self) -> None:
        while not self._stop.wait(_refresh_interval()):
            try:
                self.refresh()
            except RepositoryError:
                pass  # the next refresh tries again; a long outage makes the lock stale

    def refresh(self) -> None:
        if self.lost is None:
            self.lost = self.check()
        if self.lost is not None:
            return
        self.doc["refreshed"] = time.time()
        self.backend.save(KIND, self.name, json.dumps(self.doc).encode())

    def check(self) -> str | None:
        """Why this lock is no longer ours, or None while it is."""
        if self.exclusive:
            if self.backend.stat(KIND, f"{GC_PREFIX}{self.generation + 1:08d}") is not None:
                return "another gc took over this gc's lock (it was considered stale)"
            return None
        if self.backend.stat(KIND, self.name) is None:
            return "the lock was removed as stale"
        return None

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        try:
            if self.exclusive:
                if self.check() is None:
                    self.doc.update(state="released", refreshed=time.time())
                    self.backend.save(KIND, self.name, json.dumps(self.doc).encode())
            else:
                self.backend.remove(KIND, self.name)
        except (ObjectNotFound, RepositoryError):
            pass  # a lock left behind goes stale on its own


def _new_doc(kind: str, purpose: str) -> dict[str, Any]:
    t = time.time()
    return {"kind": kind, "purpose": purpose, "state": "held", "created": t, "refreshed": t, **holder()}


# -- captures: the shared side --------------------------------------------------------------

# The gc generation each chunk store's "known to exist" cache was filled under.
_GENERATIONS: weakref.WeakKeyDictionary[ChunkStore, int] = weakref.WeakKeyDictionary()
_GEN_LOCK = threading.Lock()


def take_capture_lock(backend: Backend, *, wait: float | None = None, purpose: str = "capture") -> HeldLock:
    """Take a shared lock: no gc runs while it is held. Waits while a gc holds the
    repository (``wait`` seconds; default: until that gc's lock would be stale, so a dead gc
    never blocks for longer than that)."""
    limit = wait if wait is not None else stale_after() + 30.0
    deadline = time.monotonic() + limit
    name = f"{CAPTURE_PREFIX}{uuid.uuid4().hex}"
    while True:
        _, running = _gc_running(backend)
        if running is None:
            doc = _new_doc("capture", purpose)
            backend.save(KIND, name, json.dumps(doc).encode(), exclusive=True)
            generation, running = _gc_running(backend)
            if running is None:
                lock = HeldLock(backend, name, doc, generation=generation, exclusive=False)
                lock.start_refreshing()
                return lock
            with contextlib.suppress(ObjectNotFound):
                backend.remove(KIND, name)  # a gc came first: let it finish
        if time.monotonic() > deadline:
            raise LockBusy(
                f"the repository {backend.url} is locked by a garbage collection ({describe(running)}) "
                f"and it did not finish within {limit:.0f} s; nothing was written. Try again once "
                "it has finished (or, if that process is gone, after its lock goes stale)."
            )
        time.sleep(_poll_interval(backend))


# Capture locks this process holds, by repository URL, with their users: a capture that
# starts while another capture (or a fork) of this process holds one joins it. Taking a
# second lock instead could deadlock: a gc waiting for the first one keeps the second out.
_HELD: dict[str, tuple[HeldLock, int]] = {}
_HELD_LOCK = threading.Lock()


@contextlib.contextmanager
def capture_lock(chunks: ChunkStore, *, wait: float | None = None, purpose: str = "capture") -> Iterator[HeldLock]:
    """Hold a shared lock around work that writes or *relies on* existing chunks (a capture,
    a fork naming an existing capsule). A chunk store whose cache of existing chunks was
    filled before a gc ran forgets it here."""
    url = chunks.backend.url
    with _HELD_LOCK:
        held = _HELD.get(url)
        if held is not None:
            _HELD[url] = (held[0], held[1] + 1)
    if held is None:
        lock = take_capture_lock(chunks.backend, wait=wait, purpose=purpose)
        with _HELD_LOCK:
            if url in _HELD:  # another thread took one meanwhile: keep one lock per URL
                other, n = _HELD[url]
                _HELD[url] = (other, n + 1)
                lock.release()
                lock = other
            else:
                _HELD[url] = (lock, 1)
    else:
        lock = held[0]
    try:
        with _GEN_LOCK:
            if _GENERATIONS.get(chunks, 0) != lock.generation:
                known = getattr(chunks, "_known", None)
                if isinstance(known, set):
                    known.clear()
                _GENERATIONS[chunks] = lock.generation
        yield lock
    finally:
        with _HELD_LOCK:
            mine, n = _HELD[url]
            if n > 1:
                _HELD[url] = (mine, n - 1)
            else:
                del _HELD[url]
        if n == 1:
            mine.release()


F = TypeVar("F", bound=Callable[..., Any])


def holds_capture_lock(fn: F) -> F:
    """Decorate ``capture_namespace(namespace, repo, ...)``: run it under a capture lock.

    If a gc nevertheless ran meanwhile (it judged this capture's lock stale: the process was
    frozen or cut off for longer than ``stale_after``), the capsule is checked for missing
    chunks before it is returned, and refused when one is missing."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        repo = kwargs.get("repo", args[1] if len(args) > 1 else None)
        chunks = getattr(repo, "chunks", None)
        if not isinstance(chunks, ChunkStore):
            return fn(*args, **kwargs)
        with capture_lock(chunks) as lock:
            result = fn(*args, **kwargs)
            generation, _ = newest_gc(chunks.backend)
            if generation != lock.generation:
                _check_survived(chunks, result)
            return result

    return wrapper  # type: ignore[return-value]


def _check_survived(chunks: ChunkStore, manifest: Any) -> None:
    names = getattr(manifest, "all_chunk_names", None)
    if names is None:
        return
    missing = [n for n in names(chunks) if chunks.backend.stat("chunks", n) is None]
    if missing:
        cap = getattr(manifest, "id", "?")
        with contextlib.suppress(ObjectNotFound, RepositoryError):
            chunks.backend.remove("capsules", f"{cap}.json")
        raise RepositoryError(
            f"a garbage collection ran during this capture (its lock was taken as stale) and "
            f"deleted {len(missing)} chunk(s) the capsule needs; capsule {cap} was withdrawn. "
            "Capture again."
        )


# -- gc: the exclusive side -----------------------------------------------------------------


def take_gc_lock(backend: Backend, *, wait: float = 300.0, purpose: str = "gc",
                 on_wait: Callable[[list[LockInfo]], None] | None = None) -> HeldLock:
    """Take the exclusive lock: refuse while another gc runs; once taken, wait (``wait``
    seconds) until every capture in flight has finished. Captures that start meanwhile wait
    for this gc."""
    while True:
        n, doc = newest_gc(backend)
        if doc is not None and why_stale(doc) is None:
            raise LockBusy(f"another garbage collection is running on {backend.url} ({describe(doc)}); "
                           "wait for it to finish")
        mine = _new_doc("gc", purpose)
        name = f"{GC_PREFIX}{n + 1:08d}"
        try:
            backend.save(KIND, name, json.dumps(mine).encode(), exclusive=True)
        except AlreadyExists:
            continue  # another gc won n+1: look again at who holds it
        backend.flush()
        lock = HeldLock(backend, name, mine, generation=n + 1, exclusive=True)
        lock.start_refreshing()
        break
    deadline = time.monotonic() + wait
    told = False
    try:
        while True:
            live = []
            for info in capture_locks(backend):
                if info.stale is None:
                    live.append(info)
                else:
                    with contextlib.suppress(ObjectNotFound):
                        backend.remove(KIND, info.name)
            if not live:
                _forget_old_gc_locks(backend, n + 1)
                return lock
            if on_wait is not None and not told:
                on_wait(live)
                told = True
            if time.monotonic() > deadline:
                raise LockBusy(
                    f"{len(live)} capture(s) in progress on {backend.url} "
                    f"({'; '.join(describe(i.doc) for i in live[:3])}) did not finish within {wait:.0f} s; "
                    "nothing was deleted. Run gc again later (or with a longer --wait)."
                )
            time.sleep(_poll_interval(backend))
    except BaseException:
        lock.release()
        raise


def _forget_old_gc_locks(backend: Backend, current: int) -> None:
    # Released gc objects only carry the generation; keep a few for the record.
    for name in list(backend.list(KIND, GC_PREFIX)):
        try:
            n = int(name[len(GC_PREFIX):])
        except ValueError:
            continue
        if n < current - 8:
            with contextlib.suppress(ObjectNotFound, RepositoryError):
                backend.remove(KIND, name)
