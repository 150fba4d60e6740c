"""Find every object that cannot travel, with its path from a root variable.

The pickler records *which* objects it had to refuse; this module finds *where* they are
(``trainer.logger.handlers[0].stream``) by walking the graph from the roots breadth-first,
so the path reported is a shortest one. The walk follows what pickling follows: container
items, instance ``__dict__`` and ``__slots__``, closure cells, and, for anything else, the
objects the garbage collector says it refers to.
"""

from __future__ import annotations

import gc
import io
import types
from collections import deque
from collections.abc import Iterator
from typing import Any

from sojourn.capsule.pickler import CapsulePickler, CaptureContext
from sojourn.capsule.registry import type_name
from sojourn.errors import Problem

_MAX_NODES = 5_000_000


def _children(obj: Any) -> Iterator[tuple[str, Any]]:
    t = type(obj)
    if t in (str, bytes, int, float, bool, complex, type(None), bytearray):
        return
    if isinstance(obj, dict):
        for k, v in list(obj.items()):
            label = f"[{k!r}]"
            yield label, v
            if not isinstance(k, str | int | float | bytes):
                yield f".keys()<{k!r}>", k
        if type(obj) is dict:
            return
    elif isinstance(obj, list | tuple):
        for i, v in enumerate(obj):
            yield f"[{i}]", v
        if type(obj) in (list, tuple):
            return
    elif isinstance(obj, set | frozenset):
        for v in list(obj):
            yield f"{{{v!r}}}", v
        if type(obj) in (set, frozenset):
            return
    if isinstance(obj, types.FunctionType):
        for name, cell in zip(obj.__code__.co_freevars, obj.__closure__ or (), strict=False):
            try:
                yield f".<closure {name}>", cell.cell_contents
            except ValueError:
                pass
        if obj.__defaults__:
            for i, v in enumerate(obj.__defaults__):
                yield f".__defaults__[{i}]", v
        yield ".__dict__", obj.__dict__
        return
    if isinstance(obj, types.ModuleType | type):
        return
    if t.__module__ != "builtins":
        yield ".__class__", t
    d = getattr(obj, "__dict__", None)
    if isinstance(d, dict):
        for k, v in list(d.items()):
            yield f".{k}", v
    for cls in t.__mro__:
        for slot in getattr(cls, "__slots__", ()) if isinstance(getattr(cls, "__slots__", ()), tuple | list) else ():
            if slot in ("__dict__", "__weakref__"):
                continue
            try:
                yield f".{slot}", getattr(obj, slot)
            except AttributeError:
                pass
    if not isinstance(d, dict):
        for i, ref in enumerate(gc.get_referents(obj)):
            if not isinstance(ref, type):
                yield f"<ref {i}>", ref


def find_paths(roots: dict[str, Any], targets: set[int]) -> dict[int, str]:
    found: dict[int, str] = {}
    seen: set[int] = set()
    queue: deque[tuple[str, Any]] = deque(roots.items())
    nodes = 0
    while queue and len(found) < len(targets) and nodes < _MAX_NODES:
        path, obj = queue.popleft()
        oid = id(obj)
        if oid in seen:
            continue
        seen.add(oid)
        nodes += 1
        if oid in targets and oid not in found:
            found[oid] = path
        try:
            for label, child in _children(obj):
                if id(child) not in seen:
                    queue.append((path + label, child))
        except Exception:
            continue
    return found


def problems_with_paths(roots: dict[str, Any], raw: list[tuple[Any, str]]) -> list[Problem]:
    paths = find_paths(roots, {id(o) for o, _ in raw})
    out: list[Problem] = []
    seen: set[int] = set()
    for obj, reason in raw:
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        out.append(Problem(paths.get(id(obj), "<unreachable>"), type_name(type(obj)), reason))
    out.sort(key=lambda p: p.path)
    return out


def scan(namespace: dict[str, Any]) -> list[Problem]:
    """Every object in ``namespace`` that cannot travel; writes nothing."""
    from sojourn.capsule import reducers  # noqa: F401
    from sojourn.capsule.capture import skipped

    ctx = CaptureContext(namespace=namespace)
    pickler = CapsulePickler(_NullSink(), ctx)  # type: ignore[arg-type]
    roots = {n: v for n, v in namespace.items() if isinstance(n, str) and not skipped(n)}
    for value in roots.values():
        pickler.dump(value)
    return problems_with_paths(roots, ctx.problems)


class _NullSink(io.RawIOBase):
    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        return len(b)
