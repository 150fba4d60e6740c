"""State shared between the pickler/unpickler and the reducers for one capture or restore.

Reducers are plain functions in a dispatch table, and reconstructors are module-level
functions that pickle calls by name, so the per-operation state they need (the namespace
being rebuilt, the device policy, the workspace root) travels through a context variable
rather than through globals.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class RestoreContext:
    namespace: dict[str, Any]
    files_to: Path
    device_policy: str = "auto"
    # Canonical reduce results of rebuilt objects whose own reduce would differ (itertools
    # rebuilt through other means, for instance), keyed by id; keeps fingerprints stable.
    canonical: dict[int, Any] = field(default_factory=dict)
    keepalive: list[Any] = field(default_factory=list)
    devices: list[str] = field(default_factory=list)
    shared_globals: dict[str, dict[str, Any]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    user_modules: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Filled by the allocators: (address, size) of restored buffers -> their chunk hashes.
    restored_buffers: dict[tuple[int, int], list[str]] = field(default_factory=dict)
    # A rehearsal of the write check in a forked child (probe.py): files are reopened for
    # reading only, so nothing rebuilt there can write into the program's files.
    rehearsal: bool = False


_CURRENT: contextvars.ContextVar[RestoreContext | None] = contextvars.ContextVar(
    "sojourn_restore", default=None
)


def current() -> RestoreContext:
    ctx = _CURRENT.get()
    if ctx is None:
        raise RuntimeError("this object can only be rebuilt by sojourn.restore()")
    return ctx


def current_or_none() -> RestoreContext | None:
    return _CURRENT.get()


@contextmanager
def restoring(ctx: RestoreContext) -> Iterator[RestoreContext]:
    token = _CURRENT.set(ctx)
    try:
        yield ctx
    finally:
        _CURRENT.reset(token)
