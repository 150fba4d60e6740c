"""Chunk-store and local-backend speed work: batched directory fsyncs (parallel within a
depth, deepest first, nothing forgotten when one fails), the shared compression contexts,
and writes started while the caller goes on (every job ends before an error is raised)."""

from __future__ import annotations

import errno
import os
import threading
import time
import uuid
from pathlib import Path

import pytest

from sojourn.errors import RepositoryError
from sojourn.repository.chunks import ChunkStore, WriteStats
from sojourn.repository.local import LocalBackend
from sojourn.repository.memory import MemoryBackend

_REAL_FSYNC = os.fsync


def _synced_dirs(monkeypatch: pytest.MonkeyPatch, fail: set[str]) -> list[str]:
    synced: list[str] = []
    real = _REAL_FSYNC

    def fsync(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        if Path(path).is_dir():
            if path in fail:
                raise OSError(errno.EIO, "Input/output error")
            synced.append(path)
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return synced


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to name fsynced files")
def test_every_shard_is_synced_before_the_chunks_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    b = LocalBackend(tmp_path / "repo")
    b.create()
    names = [f"{i:02x}{'ab' * 31}" for i in range(40)]
    for n in names:
        b.save("chunks", n, n.encode())
    synced = _synced_dirs(monkeypatch, fail=set())
    b.flush()
    chunks = str(tmp_path / "repo" / "chunks")
    shards = {str(tmp_path / "repo" / "chunks" / n[:2]) for n in names}
    assert set(synced) == shards | {chunks}
    assert synced[-1] == chunks  # the parent's entries only after every new shard's


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to name fsynced files")
def test_a_failed_directory_sync_is_reported_and_retried_by_the_next_flush(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    b = LocalBackend(tmp_path / "repo")
    b.create()
    for i in range(3):
        b.save("chunks", f"{i:02x}ff", b"x")
    bad = str(tmp_path / "repo" / "chunks" / "01")
    _synced_dirs(monkeypatch, fail={bad})
    with pytest.raises(RepositoryError, match=r"syncing .*chunks/01 failed: Input/output error"):
        b.flush()
    synced = _synced_dirs(monkeypatch, fail=set())
    b.flush()  # the failed flush promised nothing: every directory is synced again
    assert bad in synced and str(tmp_path / "repo" / "chunks") in synced


def test_many_buffers_and_both_codecs_through_the_default_pool(tmp_path: Path) -> None:
    # More chunks than threads, raw and zstd mixed, so that every worker reuses its own
    # compression context for several chunks.
    b = LocalBackend(tmp_path / "repo")
    b.create()
    cs = ChunkStore(b, chunk_size=16 << 10)
    try:
        bufs = [os.urandom(50_000 + i) if i % 2 else bytes([i]) * (70_000 + i) for i in range(24)]
        stats = WriteStats()
        recs = cs.put_many([memoryview(x) for x in bufs], stats)
        assert {r.codec for r in recs} == {"raw", "zstd"}
        b.flush()
        fresh = ChunkStore(LocalBackend(tmp_path / "repo"), chunk_size=16 << 10)
        try:
            outs = [bytearray(len(x)) for x in bufs]
            fresh.get_many((r, memoryview(o)) for r, o in zip(recs, outs, strict=True))
            assert outs == [bytearray(x) for x in bufs]
        finally:
            fresh.close()
    finally:
        cs.close()


class _SlowFailing:
    """A memory backend whose saves take a while, and one of which fails."""

    def __init__(self, fail_on: int):
        self.inner = MemoryBackend(f"pending-{uuid.uuid4().hex}")
        self.inner.create()
        self.url = self.inner.url
        self.saves = 0
        self.fail_on = fail_on
        self._lock = threading.Lock()

    def save(self, kind: str, name: str, data: bytes | memoryview, *, exclusive: bool = False) -> None:
        with self._lock:
            self.saves += 1
            mine = self.saves
        time.sleep(0.02)
        if mine == self.fail_on:
            raise RepositoryError("the disk is full")
        self.inner.save(kind, name, data, exclusive=exclusive)

    def __getattr__(self, attr: str) -> object:
        return getattr(self.inner, attr)


def test_started_writes_give_the_same_records_and_end_before_an_error_is_raised() -> None:
    data = [os.urandom(3 * 4096 + 1 + i) for i in range(6)]  # four chunks each
    ok = _SlowFailing(fail_on=0)
    cs = ChunkStore(ok, chunk_size=4096, workers=4)  # type: ignore[arg-type]
    try:
        pending = cs.start_put_many([memoryview(d) for d in data], WriteStats())
        recs = pending.wait()
        assert [r.chunks for r in recs] == [r.chunks for r in cs.put_many([memoryview(d) for d in data], WriteStats())]
        assert [bytes(cs.get(r)) for r in recs] == data
    finally:
        cs.close()

    bad = _SlowFailing(fail_on=3)
    cs = ChunkStore(bad, chunk_size=4096, workers=4)  # type: ignore[arg-type]
    try:
        pending = cs.start_put_many([memoryview(d) for d in data], WriteStats())
        with pytest.raises(RepositoryError, match="the disk is full"):
            pending.wait()
        done = bad.saves
        time.sleep(0.1)
        assert bad.saves == done == 6 * 4  # every chunk was attempted, none is still running
    finally:
        cs.close()
