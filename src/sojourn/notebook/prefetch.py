"""A move's destination reads the kernel's previous capsule while the source captures.

A move's capsule is incremental to the kernel's last autosave: between two cells most of
its chunks are the same content. The destination learns that previous capsule when it is
started (``$SOJOURN_PREFETCH``), allocates its buffers as their final objects and reads and
hash-checks their chunks in a background thread, while it imports ipykernel and while the
source is still capturing. When the move's capsule arrives, each of its buffers takes a
prefetched object of the same kind, meta and size, and only the chunks whose hashes differ
are read into it: the restore after the capture reads what changed, not the whole state.

Nothing here weakens a check: a prefetched chunk was read and hash-checked like any other,
the new manifest names it by the same hash, the manifest's signature is checked as always,
and the fingerprints are compared after the restore.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from sojourn.repository.chunks import BufferRecord

ENV = "SOJOURN_PREFETCH"

class _Held:
    def __init__(self, buf: Any, obj: Any, view: memoryview):
        self.kind, self.meta, self.size = buf.kind, _key(buf.meta), buf.record.size
        self.chunks: list[str] = list(buf.record.chunks)
        self.obj, self.view = obj, view


def _key(meta: Any) -> str:
    return json.dumps(meta, sort_keys=True, default=str)


class Prefetch:
    """The previous capsule's buffers, read in a thread; ``reuse`` hands them to the restore."""

    def __init__(self, capsule: str, repo: str | None):
        self.capsule, self.repo = capsule, repo
        self.held: list[_Held] = []
        self.error: str | None = None
        self.seconds = 0.0
        self.chunk_size = 0  # the repository's: every chunk of a buffer but its last has this size
        self.stats = {"reused": 0, "read": 0}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sojourn-prefetch", daemon=True)

    @classmethod
    def from_env(cls, text: str | None) -> Prefetch | None:
        if not text:
            return None
        try:
            d = json.loads(text)
            return cls(str(d["capsule"]), d.get("repo"))
        except (ValueError, KeyError, TypeError):
            return None  # a malformed hint only costs the prefetch

    def start(self) -> Prefetch:
        self._thread.start()
        return self

    def _run(self) -> None:
        t0 = time.perf_counter()
        try:
            from sojourn.capsule import format as fmt
            from sojourn.capsule.reducers.numpy import small_pages
            from sojourn.capsule.restore import _allocate
            from sojourn.repository.repo import open_repository

            with open_repository(self.repo) as r:
                self.chunk_size = r.chunks.chunk_size
                manifest = fmt.load_manifest(r, self.capsule)
                held, pairs = [], []
                # Allocated as the restore would (see reducers/numpy.py small_pages).
                with small_pages(any(b.kind == "ndarray" for b in manifest.buffers)):
                    for buf in manifest.buffers:
                        obj, view = _allocate(buf)
                        held.append(_Held(buf, obj, view))
                        pairs.append((buf.record, view))
                r.chunks.get_many(pairs)
            self.held = held
        except Exception as e:  # the restore reads everything itself: the move only loses time
            self.error = f"{type(e).__name__}: {e}"
            self.held = []
        finally:
            self.seconds = time.perf_counter() - t0
            self._done.set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    def reuse(self, manifest: Any) -> list[tuple[Any, memoryview, list[tuple[BufferRecord, memoryview]]] | None]:
        """For each buffer of ``manifest``: a prefetched object and the chunks still to read into
        it, or None. An exact match (every chunk the same) is preferred; else one of the same
        kind, meta and size sharing at least one chunk at the same place. Prefetched objects
        that nothing takes are dropped before the restore allocates the rest."""
        self._done.wait()
        exact: dict[tuple[str, str, int, tuple[str, ...]], list[_Held]] = {}
        similar: dict[tuple[str, str, int], list[_Held]] = {}
        for h in self.held:
            exact.setdefault((h.kind, h.meta, h.size, tuple(h.chunks)), []).append(h)
            similar.setdefault((h.kind, h.meta, h.size), []).append(h)
        taken: set[int] = set()
        out: list[tuple[Any, memoryview, list[tuple[BufferRecord, memoryview]]] | None] = []
        pending_bufs = []
        for i, buf in enumerate(manifest.buffers):
            rec = buf.record
            meta = _key(buf.meta)
            cands = [h for h in exact.get((buf.kind, meta, rec.size, tuple(rec.chunks)), []) if id(h) not in taken]
            if cands:
                taken.add(id(cands[0]))
                out.append((cands[0].obj, cands[0].view, []))
                self.stats["reused"] += len(rec.chunks)
                continue
            out.append(None)
            pending_bufs.append(i)
        for i in pending_bufs:  # partial matches, once every exact one has its object
            buf = manifest.buffers[i]
            rec = buf.record
            best, same = None, 0
            for h in similar.get((buf.kind, _key(buf.meta), rec.size), []):
                if id(h) in taken:
                    continue
                n = sum(a == b for a, b in zip(h.chunks, rec.chunks, strict=True))
                if n > same:
                    best, same = h, n
            if best is None:
                continue
            taken.add(id(best))
            view = best.view.cast("B") if (best.view.ndim != 1 or best.view.format != "B") else best.view
            cs = self.chunk_size
            todo = [(BufferRecord(size=len(view[j * cs:(j + 1) * cs]), codec=rec.codec, chunks=[h]),
                     view[j * cs:(j + 1) * cs])
                    for j, h in enumerate(rec.chunks) if best.chunks[j] != h]
            self.stats["reused"] += same
            self.stats["read"] += len(todo)
            out[i] = (best.obj, best.view, todo)
        self.stats["read"] += sum(len(manifest.buffers[i].record.chunks) for i, o in enumerate(out) if o is None)
        self.held = []  # what nothing took is freed before the rest is allocated
        return out

    def summary(self) -> str:
        if self.error:
            return f"prefetch of {self.capsule} failed ({self.error})"
        total = self.stats["reused"] + self.stats["read"]
        return (f"prefetched {self.capsule} in {self.seconds:.2f} s: {self.stats['reused']} of {total} "
                f"chunks reused")
