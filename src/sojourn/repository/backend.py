"""The backend interface: a handful of operations on named, immutable-ish objects.

Like restic's backends, a backend knows nothing about chunks, capsules or workspaces: it
stores bytes under ``(kind, name)``. Retry, caching and logging wrap a backend instead of
living inside it, and every backend passes one conformance suite
(``tests/repository/conformance.py``).

Semantics every backend keeps:

* ``save`` is atomic: a reader sees the whole object or nothing, never a prefix.
* ``save(..., exclusive=True)`` creates the object only if it does not exist and raises
  :class:`~sojourn.errors.AlreadyExists` otherwise; this is the repository's one
  compare-and-swap primitive (rename/link locally, ``If-None-Match: *`` on S3).
* ``flush`` makes every earlier ``save`` durable (the local backend fsyncs directories
  in one batch there instead of once per object).
* Missing objects raise :class:`~sojourn.errors.ObjectNotFound`.

A backend may also carry ``compress_below`` (a float): the compressed/plain ratio of a
sample under which chunks are stored compressed (see :func:`sojourn.repository.chunks.compress_below`;
without it, local and in-memory backends get 0.5 and any other 0.9), and
``compress_level`` (an int): the zstd level those chunks are written at (without it, -3
locally, 1 elsewhere; see :func:`sojourn.repository.chunks.compress_level`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol, runtime_checkable

KINDS = ("config", "chunks", "capsules", "workspaces", "locks")


@runtime_checkable
class Backend(Protocol):
    url: str

    def save(self, kind: str, name: str, data: bytes | memoryview, *, exclusive: bool = False) -> None: ...

    def load(self, kind: str, name: str) -> bytes: ...

    def load_into(self, kind: str, name: str, out: memoryview) -> int:
        """Read the object into ``out`` (exactly its size); return the byte count."""
        ...

    def stat(self, kind: str, name: str) -> int | None:
        """Size of the object, or None when it does not exist."""
        ...

    def list(self, kind: str, prefix: str = "") -> Iterator[str]: ...

    def remove(self, kind: str, name: str) -> None: ...

    def flush(self) -> None: ...

    def exists(self) -> bool:
        """Whether the repository location itself exists (not an object in it)."""
        ...

    def create(self) -> None:
        """Create the repository location (directory, or nothing for object stores)."""
        ...


def check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown object kind {kind!r}; expected one of {', '.join(KINDS)}")


def check_name(name: str) -> None:
    # Names become file names and object keys: keep them to a portable alphabet.
    if not name or name.startswith(".") or "/" in name or "\\" in name or "\0" in name:
        raise ValueError(f"invalid object name {name!r}")
