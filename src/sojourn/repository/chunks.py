"""Content-addressed chunks: written once, named by their BLAKE3 hash, checked on every read.

A buffer (an array's bytes, the pickle stream, a file) is cut into fixed-size chunks aligned
to the buffer's start, so an in-place change to a large array rewrites only the chunks it
touched and an unchanged chunk is never written twice. Compression is decided per buffer by
trying a sample: random floats do not compress and zstd would only cost time, zero-filled
buffers shrink a thousandfold.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import blake3
import zstandard

from sojourn.errors import IntegrityError, ObjectNotFound
from sojourn.repository.backend import Backend

DEFAULT_CHUNK_SIZE = 4 << 20
_SAMPLE = 64 << 10
_ZSTD_SUFFIX = "-z"


def chunk_hash(data: bytes | memoryview) -> str:
    # Large inputs hash on several threads and without the GIL.
    threads = blake3.blake3.AUTO if len(data) >= (1 << 20) else 1
    return blake3.blake3(data, max_threads=threads).hexdigest()


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


def _compressible(data: memoryview) -> bool:
    if len(data) < 4096:
        return len(data) > 64
    step = max(1, len(data) // 4)
    sample = b"".join(bytes(data[i : i + _SAMPLE // 4]) for i in range(0, len(data), step))[:_SAMPLE]
    return len(zstandard.ZstdCompressor(level=1).compress(sample)) < 0.7 * len(sample)


class ChunkStore:
    def __init__(self, backend: Backend, chunk_size: int = DEFAULT_CHUNK_SIZE, workers: int | None = None):
        self.backend = backend
        self.chunk_size = chunk_size
        self.workers = workers or min(16, 2 * (os.cpu_count() or 2))
        self._known: set[str] = set()
        self._pool: ThreadPoolExecutor | None = None

    @property
    def pool(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="sojourn-chunks")
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    # -- writing ----------------------------------------------------------------------------

    def put_many(self, buffers: Iterable[memoryview], stats: WriteStats, codec: str = "auto") -> list[BufferRecord]:
        """Store several buffers, all chunks in parallel; return their records in order."""
        records: list[BufferRecord] = []
        jobs = []
        for buf in buffers:
            view = memoryview(buf).cast("B") if buf.ndim != 1 or buf.format != "B" else buf
            c = codec if codec != "auto" else ("zstd" if _compressible(view) else "raw")
            rec = BufferRecord(size=len(view), codec=c, chunks=[""] * _count(len(view), self.chunk_size))
            records.append(rec)
            stats.logical += len(view)
            for i, off in enumerate(range(0, len(view), self.chunk_size)):
                jobs.append(self.pool.submit(self._put_chunk, rec, i, view[off : off + self.chunk_size], stats))
        for j in jobs:
            j.result()
        return records

    def put(self, data: bytes | memoryview, stats: WriteStats, codec: str = "auto") -> BufferRecord:
        return self.put_many([memoryview(data)], stats, codec)[0]

    def _put_chunk(self, rec: BufferRecord, i: int, piece: memoryview, stats: WriteStats) -> None:
        h = chunk_hash(piece)
        rec.chunks[i] = h
        name = chunk_name(h, rec.codec)
        if name in self._known or self.backend.stat("chunks", name) is not None:
            self._known.add(name)
            stats.add(reused=1)
            return
        payload: bytes | memoryview = piece
        if rec.codec == "zstd":
            payload = zstandard.ZstdCompressor(level=3).compress(piece)
        self.backend.save("chunks", name, payload)
        self._known.add(name)
        stats.add(written=len(payload), new=1)

    # -- reading ----------------------------------------------------------------------------

    def get_into(self, rec: BufferRecord, out: memoryview) -> None:
        """Fill ``out`` with the buffer, checking every chunk's hash."""
        self.get_many([(rec, out)])

    def get_many(self, pairs: Iterable[tuple[BufferRecord, memoryview]]) -> None:
        jobs = []
        for rec, out in pairs:
            view = out.cast("B") if (out.ndim != 1 or out.format != "B") else out
            if len(view) != rec.size:
                raise IntegrityError(f"buffer is {rec.size} bytes but {len(view)} were allocated")
            for i, h in enumerate(rec.chunks):
                off = i * self.chunk_size
                jobs.append(self.pool.submit(self._get_chunk, h, rec.codec, view[off : off + self.chunk_size]))
        errors = []
        for j in jobs:
            try:
                j.result()
            except (IntegrityError, ObjectNotFound) as e:
                errors.append(e)
        if errors:
            raise errors[0]

    def get(self, rec: BufferRecord) -> bytearray:
        out = bytearray(rec.size)
        self.get_into(rec, memoryview(out))
        return out

    def _get_chunk(self, h: str, codec: str, out: memoryview) -> None:
        name = chunk_name(h, codec)
        try:
            if codec == "zstd":
                blob = self.backend.load("chunks", name)
                try:
                    plain = zstandard.ZstdDecompressor().decompress(blob, max_output_size=len(out))
                except zstandard.ZstdError as e:
                    raise IntegrityError(f"chunk {h[:16]}… is corrupt: it does not decompress ({e})") from None
                if len(plain) != len(out):
                    raise IntegrityError(f"chunk {h[:16]}… is corrupt: wrong size after decompression")
                out[:] = plain
            else:
                self.backend.load_into("chunks", name, out)
        except ObjectNotFound as e:
            raise ObjectNotFound(f"chunk {h[:16]}… is missing from the repository ({e})") from None
        if chunk_hash(out) != h:
            raise IntegrityError(
                f"chunk {h[:16]}… is corrupt: its content does not match its hash "
                "(the repository was altered or the disk is failing)"
            )

    def exists(self, rec: BufferRecord) -> list[str]:
        """Names of this record's chunks that are missing."""
        missing = []
        for name in rec.names():
            if name not in self._known and self.backend.stat("chunks", name) is None:
                missing.append(name)
        return missing


def _count(size: int, chunk: int) -> int:
    return (size + chunk - 1) // chunk if size else 0
