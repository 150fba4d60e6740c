"""zstd from whichever module this interpreter has: ``zstandard`` (3.11-3.13 wheels), the
standard library's ``compression.zstd`` (3.14 on) or ``backports.zstd`` (its backport).

Every one writes and reads the same format (RFC 8878 frames), so a chunk compressed by one
decompresses with any other: a capsule written where ``zstandard`` is installed is read on a
Python 3.15 that only has ``compression.zstd``, and back. ``$SOJOURN_ZSTD`` (``zstandard``,
``stdlib``, ``backports``) forces one, for tests and for a broken install.
"""

from __future__ import annotations

import os
import threading
from types import ModuleType
from typing import Any

_codecs = threading.local()


def _load() -> tuple[str, ModuleType]:
    want = os.environ.get("SOJOURN_ZSTD", "")
    order = [want] if want else ["zstandard", "stdlib", "backports"]
    tried = []
    for name in order:
        try:
            if name == "zstandard":
                import zstandard as mod
            elif name == "stdlib":
                from compression import zstd as mod  # type: ignore[no-redef]  # Python 3.14+
            elif name == "backports":
                from backports import zstd as mod  # type: ignore[no-redef]
            else:
                raise ImportError(f"$SOJOURN_ZSTD={want!r} is none of zstandard, stdlib, backports")
        except ImportError as e:
            tried.append(f"{name}: {e}")
            continue
        return name, mod
    raise ImportError(
        "sojourn needs zstd: install `zstandard` (Python 3.11-3.13) or `backports.zstd`, or use "
        "Python 3.14+ (compression.zstd) (" + "; ".join(tried) + ")"
    )


IMPLEMENTATION, _mod = _load()
ZstdError: type[Exception] = _mod.ZstdError


def compress(data: Any, level: int) -> bytes:
    """One complete frame. A compression context allocates several MiB: one is kept per
    thread and level (they are not thread-safe; both libraries release the GIL)."""
    cs: dict[int, Any] | None = getattr(_codecs, "compressors", None)
    if cs is None:
        cs = _codecs.compressors = {}
    c = cs.get(level)
    if IMPLEMENTATION == "zstandard":
        if c is None:
            c = cs[level] = _mod.ZstdCompressor(level=level)
        return c.compress(data)  # type: ignore[no-any-return]
    if c is None:
        c = cs[level] = _mod.ZstdCompressor(level=level)
    # FLUSH_FRAME ends the frame; the same compressor then starts a new one on the next call.
    return c.compress(data, mode=_mod.ZstdCompressor.FLUSH_FRAME)  # type: ignore[no-any-return]


def decompress(blob: Any, size: int) -> bytes:
    """The frame's content, at most ``size`` bytes (a corrupt or hostile chunk cannot make
    it allocate more); raises ZstdError (or returns fewer bytes) when the blob is damaged."""
    if IMPLEMENTATION == "zstandard":
        d = getattr(_codecs, "decompressor", None)
        if d is None:
            d = _codecs.decompressor = _mod.ZstdDecompressor()
        return d.decompress(blob, max_output_size=size)  # type: ignore[no-any-return]
    # compression.zstd's decompressor reads one frame and is then spent: one per chunk (cheap).
    d = _mod.ZstdDecompressor()
    out = d.decompress(blob, max_length=size)
    if not d.eof:
        raise _mod.ZstdError("the frame is truncated or larger than its chunk")
    return out  # type: ignore[no-any-return]
