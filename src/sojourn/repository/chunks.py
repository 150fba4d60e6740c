"""Content-addressed chunks: written once, named by their BLAKE3 hash, checked on every read.

A buffer (an array's bytes, the pickle stream, a file) is cut into fixed-size chunks aligned
to the buffer's start, so an in-place change to a large array rewrites only the chunks it
touched and an unchanged chunk is never written twice. Compression is decided per buffer by
trying a sample, against a bar the backend sets (:func:`compress_below`): random floats do
not compress and zstd would only cost time; zero-filled buffers shrink a thousandfold.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import blake3

from sojourn.errors import IntegrityError, ObjectNotFound
from sojourn.repository import zstd
from sojourn.repository.backend import Backend
from sojourn.threads import Executor

DEFAULT_CHUNK_SIZE = 4 << 20
_SAMPLE = 64 << 10
_ZSTD_SUFFIX = "-z"
# Level 1 compresses numeric buffers as well as level 3 (sometimes better) at two to three
# times the speed; level 3 ran at 150-450 MB/s a core, slower than the disks it writes to.
# The level only matters when writing: every level decompresses with the same decoder, so
# chunks written at any level are read alike (and named alike: a chunk's name is the hash
# of its plain bytes).
REMOTE_ZSTD_LEVEL = 1
# A local disk takes bytes faster than level 1 makes them (see compress_below): zstd's fast
# level -3 ran at 1225 MiB/s a core against 691 for level 1 on an AdamW state one step in,
# for a ratio of 0.36 against 0.29 (bench state, 200 MiB of compressible moments).
LOCAL_ZSTD_LEVEL = -3


def chunk_hash(data: bytes | memoryview) -> str:
    # One thread per chunk: blake3 releases the GIL, and the chunk store hashes many chunks
    # at once on its pool; blake3's own threads were slower than that (measured on 2 cores).
    return blake3.blake3(data, max_threads=1).hexdigest()


def default_workers() -> int:
    # Chunk work is mostly waiting on the disk or the network (fsync, reads, requests), so
    # the pool is sized for I/O in flight rather than for cores: 4 threads left a local disk
    # idle between fsyncs, 8-16 kept it busy (measured on 2 cores), and an object store
    # wants more requests in flight still (the S3 backend keeps 32 connections).
    return min(32, max(16, 4 * (os.cpu_count() or 2)))


@dataclass
class BufferRecord:
    """Where one buffer lives: its size, codec and chunk hashes in order."""

    size: int
    codec: str = "raw"
    chunks: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"size": self.size, "codec": self.codec, "chunks": self.chunks}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> BufferRecord:
        return cls(size=int(d["size"]), codec=str(d.get("codec", "raw")), chunks=list(d["chunks"]))

    def names(self) -> list[str]:
        return [chunk_name(h, self.codec) for h in self.chunks]


def chunk_name(h: str, codec: str) -> str:
    return h + _ZSTD_SUFFIX if codec == "zstd" else h


@dataclass
class WriteStats:
    logical: int = 0  # bytes handed to put()
    written: int = 0  # bytes actually sent to the backend (new chunks, after compression)
    chunks_new: int = 0
    chunks_reused: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, *, written: int = 0, new: int = 0, reused: int = 0) -> None:
        with self._lock:
            self.written += written
            self.chunks_new += new
            self.chunks_reused += reused


# Whether compressing a buffer pays depends on where its bytes go. zstd level 1 runs at about
# 640 MiB/s a core on numeric data (int64 holding 40-bit values: ratio 0.75); a local disk
# takes ~1 GiB/s, so saving a quarter of the bytes costs four times the time it saves, and on
# a small machine that CPU is taken from hashing and pickling (a 1 GiB capture on 2 cores:
# 0.34 s of compression to save 55 MiB of writes). Locally, compress only what at least
# halves (zero pages, text, sparse data: zstd is also fastest there). Over a network every
# byte saved is worth far more CPU: there, compress anything that saves a tenth.
LOCAL_COMPRESS_BELOW = 0.5
REMOTE_COMPRESS_BELOW = 0.9


def compress_below(backend: Backend) -> float:
    """The compressed/plain ratio of a sample under which a buffer is stored compressed.

    A backend may set ``compress_below`` itself; otherwise one that names a local path or
    lives in memory gets :data:`LOCAL_COMPRESS_BELOW`, any other :data:`REMOTE_COMPRESS_BELOW`.
    """
    bar = getattr(backend, "compress_below", None)
    if isinstance(bar, int | float):
        return float(bar)
    return LOCAL_COMPRESS_BELOW if _is_local(backend) else REMOTE_COMPRESS_BELOW


def compress_level(backend: Backend) -> int:
    """The zstd level chunks are written at: fast for a local disk, denser over a network
    (a backend may set ``compress_level`` itself)."""
    level = getattr(backend, "compress_level", None)
    if isinstance(level, int):
        return level
    return LOCAL_ZSTD_LEVEL if _is_local(backend) else REMOTE_ZSTD_LEVEL


def _is_local(backend: Backend) -> bool:
    url = str(getattr(backend, "url", ""))
    return url.startswith("memory://") or "://" not in url


def _compressible(data: memoryview, below: float, level: int = REMOTE_ZSTD_LEVEL) -> bool:
    if len(data) < 4096:
        return len(data) > 64
    step = max(1, len(data) // 4)
    sample = b"".join(bytes(data[i : i + _SAMPLE // 4]) for i in range(0, len(data), step))[:_SAMPLE]
    return len(zstd.compress(sample, level)) < below * len(sample)


@dataclass
class PendingPut:
    """Chunk writes in flight (see :meth:`ChunkStore.start_put_many`)."""

    records: list[BufferRecord]
    jobs: list[Future[list[Future[None]]]]  # one per buffer; each gives its chunks' jobs

    def wait(self) -> list[BufferRecord]:
        chunk_jobs: list[Future[None]] = []
        errors = _wait_all(self.jobs, chunk_jobs.extend)
        errors += _wait_all(chunk_jobs, lambda _: None)
        if errors:
            raise errors[0]
        return self.records


def _wait_all(jobs: list[Future[Any]], take: Any) -> list[Exception]:
    # Every job ends before an error is raised: a caller that gives up on an error must not
    # have chunk writes or reads into its buffers still running behind its back.
    errors = []
    for j in jobs:
        try:
            take(j.result())
        except Exception as e:
            errors.append(e)
    return errors


class ChunkStore:
    """Chunks of one repository. ``naming(hash, codec)`` gives a chunk's object name: in a
    plain repository the hash itself (:func:`chunk_name`), in an encrypted one a keyed hash
    (:meth:`sojourn.repository.crypto.RepoKeys.chunk_name`). Records always hold the plain
    content hashes (the fingerprints are made of them); only the stored names differ."""

    def __init__(
        self,
        backend: Backend,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        workers: int | None = None,
        naming: Callable[[str, str], str] | None = None,
    ):
        self.backend = backend
        self.chunk_size = chunk_size
        self.naming = naming or chunk_name
        self.keyed = naming is not None
        self.workers = workers or default_workers()
        self._known: set[str] = set()
        self._pool: ThreadPoolExecutor | None = None
        self.compress_below = compress_below(backend)
        self.compress_level = compress_level(backend)

    @property
    def pool(self) -> ThreadPoolExecutor:
        if self._pool is None:
            # Executor: where no worker can be started (`ulimit -v`), the chunks are written inline.
            self._pool = Executor(self.workers, thread_name_prefix="sojourn-chunks")
        return self._pool

    def names(self, rec: BufferRecord) -> list[str]:
        """The object names of a record's chunks in this repository."""
        return [self.naming(h, rec.codec) for h in rec.chunks]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    # -- writing ----------------------------------------------------------------------------

    def put_many(self, buffers: Iterable[memoryview], stats: WriteStats, codec: str = "auto") -> list[BufferRecord]:
        """Store several buffers, all chunks in parallel; return their records in order."""
        return self.start_put_many(buffers, stats, codec).wait()

    def start_put_many(self, buffers: Iterable[memoryview], stats: WriteStats, codec: str = "auto") -> PendingPut:
        """Start storing several buffers and return at once; ``wait()`` gives their records.

        A caller can go on with its own work (pickling the next variables) while the chunks
        are hashed and written. The buffers must stay alive and unchanged until ``wait()``
        returns.
        """
        records: list[BufferRecord] = []
        jobs: list[Future[list[Future[None]]]] = []
        for buf in buffers:
            view = memoryview(buf).cast("B") if buf.ndim != 1 or buf.format != "B" else buf
            rec = BufferRecord(size=len(view), codec=codec, chunks=[""] * _count(len(view), self.chunk_size))
            records.append(rec)
            stats.logical += len(view)
            jobs.append(self.pool.submit(self._put_buffer, rec, view, stats))
        return PendingPut(records, jobs)

    def _put_buffer(self, rec: BufferRecord, view: memoryview, stats: WriteStats) -> list[Future[None]]:
        # On the pool, not in the caller's thread: trying a sample with zstd is cheap but
        # not free, and the caller may be pickling the next variables meanwhile.
        if rec.codec == "auto":
            rec.codec = "zstd" if _compressible(view, self.compress_below, self.compress_level) else "raw"
        if len(rec.chunks) == 1:
            self._put_chunk(rec, 0, view, stats)
            return []
        cs = self.chunk_size
        return [self.pool.submit(self._put_chunk, rec, i, view[i * cs : (i + 1) * cs], stats) for i in range(len(rec.chunks))]

    def put(self, data: bytes | memoryview, stats: WriteStats, codec: str = "auto") -> BufferRecord:
        return self.put_many([memoryview(data)], stats, codec)[0]

    def _put_chunk(self, rec: BufferRecord, i: int, piece: memoryview, stats: WriteStats) -> None:
        h = chunk_hash(piece)
        rec.chunks[i] = h
        name = self.naming(h, rec.codec)
        if name in self._known or self.backend.stat("chunks", name) is not None:
            self._known.add(name)
            stats.add(reused=1)
            return
        payload: bytes | memoryview = piece
        if rec.codec == "zstd":
            payload = zstd.compress(piece, self.compress_level)
        self.backend.save("chunks", name, payload)
        self._known.add(name)
        stats.add(written=len(payload), new=1)

    # -- reading ----------------------------------------------------------------------------

    def get_into(self, rec: BufferRecord, out: memoryview) -> None:
        """Fill ``out`` with the buffer, checking every chunk's hash."""
        self.get_many([(rec, out)])

    def get_many(self, pairs: Iterable[tuple[BufferRecord, memoryview]]) -> None:
        """Fill each buffer with its record's bytes, all chunks in parallel, every hash checked."""
        work = []
        for rec, out in pairs:
            view = out.cast("B") if (out.ndim != 1 or out.format != "B") else out
            if len(view) != rec.size:
                raise IntegrityError(f"buffer is {rec.size} bytes but {len(view)} were allocated")
            work.append((rec, view))
        cs = self.chunk_size
        jobs = [
            self.pool.submit(self._get_chunk, h, rec.codec, view[i * cs : (i + 1) * cs])
            for rec, view in work
            for i, h in enumerate(rec.chunks)
        ]
        errors = _wait_all(jobs, lambda _: None)
        if errors:
            raise errors[0]

    def get(self, rec: BufferRecord) -> bytearray:
        out = bytearray(rec.size)
        self.get_into(rec, memoryview(out))
        return out

    def _get_chunk(self, h: str, codec: str, out: memoryview) -> None:
        name = self.naming(h, codec)
        try:
            if codec == "zstd":
                blob = self.backend.load("chunks", name)
                try:
                    plain = zstd.decompress(blob, len(out))
                except zstd.ZstdError as e:
                    raise IntegrityError(f"chunk {name[:16]}… is corrupt: it does not decompress ({e})") from None
                if len(plain) != len(out):
                    raise IntegrityError(f"chunk {name[:16]}… is corrupt: wrong size after decompression")
                out[:] = plain
            else:
                self.backend.load_into("chunks", name, out)
        except ObjectNotFound as e:
            raise ObjectNotFound(f"chunk {name[:16]}… is missing from the repository ({e})") from None
        except IntegrityError as e:
            if str(e).startswith("chunk "):
                raise
            raise IntegrityError(f"chunk {name[:16]}… is corrupt: {e}") from None
        if chunk_hash(out) != h:
            raise IntegrityError(
                f"chunk {name[:16]}… is corrupt: its content does not match its hash "
                "(the repository was altered or the disk is failing)"
            )

    def exists(self, rec: BufferRecord) -> list[str]:
        """Names of this record's chunks that are missing."""
        missing = []
        for name in self.names(rec):
            if name not in self._known and self.backend.stat("chunks", name) is None:
                missing.append(name)
        return missing


def _count(size: int, chunk: int) -> int:
    return (size + chunk - 1) // chunk if size else 0
