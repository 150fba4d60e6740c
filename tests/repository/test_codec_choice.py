"""Which buffers are stored compressed: a sample is tried with zstd, and the bar it must
pass is the backend's. Locally, zstd must at least halve the bytes (below that it costs more
CPU than the writes it saves); over a network, saving a tenth is enough."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sojourn.repository.chunks import (
    LOCAL_COMPRESS_BELOW,
    LOCAL_ZSTD_LEVEL,
    REMOTE_COMPRESS_BELOW,
    REMOTE_ZSTD_LEVEL,
    ChunkStore,
    WriteStats,
    compress_below,
    compress_level,
)
from sojourn.repository.local import LocalBackend
from sojourn.repository.memory import MemoryBackend


def _forty_bit_ints(n: int) -> bytes:
    # int64 values under 2**40: five random bytes and three zero bytes each. zstd level 1
    # stores them at ~0.7 of their size, like a numpy array of ids or timestamps.
    rnd = os.urandom(5 * n)
    return b"".join(rnd[5 * i : 5 * i + 5] + b"\0\0\0" for i in range(n))


def _codecs(backend: object, buffers: list[bytes]) -> list[str]:
    store = ChunkStore(backend, chunk_size=64 << 10)  # type: ignore[arg-type]
    try:
        return [r.codec for r in store.put_many([memoryview(b) for b in buffers], WriteStats())]
    finally:
        store.close()


def test_bars_by_backend(tmp_path: Path) -> None:
    assert compress_below(LocalBackend(tmp_path / "r")) == LOCAL_COMPRESS_BELOW == 0.5
    assert compress_below(MemoryBackend("codec-bars")) == LOCAL_COMPRESS_BELOW
    pytest.importorskip("boto3")
    from sojourn.repository.s3 import S3Backend

    # Constructing the backend makes a client but sends no request.
    assert compress_below(S3Backend("s3://bucket/prefix")) == REMOTE_COMPRESS_BELOW == 0.9


def test_local_repository_keeps_moderately_compressible_buffers_raw(tmp_path: Path) -> None:
    b = LocalBackend(tmp_path / "repo")
    b.create()
    ints, zeros, noise = _forty_bit_ints(40_000), bytes(300_000), os.urandom(300_000)
    assert _codecs(b, [ints, zeros, noise]) == ["raw", "zstd", "raw"]


class _RemoteLike(MemoryBackend):
    # Stands in for a network backend (no S3 server needed to test the bar itself): the
    # documented ``compress_below`` attribute is how a backend sets its own.
    compress_below = REMOTE_COMPRESS_BELOW
    compress_level = REMOTE_ZSTD_LEVEL


def test_a_backend_with_a_lower_bar_compresses_them_and_reads_them_back() -> None:
    backend = _RemoteLike("codec-remote")
    ints, zeros, noise = _forty_bit_ints(40_000), bytes(300_000), os.urandom(300_000)
    assert _codecs(backend, [ints, zeros, noise]) == ["zstd", "zstd", "raw"]
    store = ChunkStore(backend, chunk_size=64 << 10)
    try:
        rec = store.put(ints, WriteStats())
        out = bytearray(len(ints))
        store.get_into(rec, memoryview(out))
        assert out == ints
    finally:
        store.close()


def test_levels_by_backend_and_chunks_of_any_level_read_alike(tmp_path: Path) -> None:
    """A local disk gets zstd's fast level, a network the denser one; a chunk's name is the
    hash of its plain bytes, so a store reading at another level still finds and reads it."""
    local = LocalBackend(tmp_path / "repo")
    local.create()
    assert compress_level(local) == LOCAL_ZSTD_LEVEL < REMOTE_ZSTD_LEVEL == compress_level(_RemoteLike("lv"))
    text = b"".join(b"step %d loss %.6f\n" % (i, 1 / (i + 1)) for i in range(40_000))
    fast = ChunkStore(local, chunk_size=64 << 10)
    try:
        fast_stats = WriteStats()
        rec = fast.put(text, fast_stats)
        assert rec.codec == "zstd" and fast_stats.written < len(text) // 2
    finally:
        fast.close()

    class Dense(LocalBackend):
        compress_level = REMOTE_ZSTD_LEVEL

    dense_backend = Dense(tmp_path / "repo")
    dense = ChunkStore(dense_backend, chunk_size=64 << 10)
    try:
        dense_stats = WriteStats()
        again = dense.put(text, dense_stats)
        assert again.chunks == rec.chunks and dense_stats.chunks_new == 0  # same names: reused
        out = bytearray(len(text))
        dense.get_into(rec, memoryview(out))
        assert out == text
    finally:
        dense.close()
