"""Find every object that cannot travel, with its path from a root variable.

The pickler records *which* objects it had to refuse; this module finds *where* they are
(``trainer.logger.handlers[0].stream``) by walking the graph from the roots breadth-first,
so the path reported is a shortest one. The walk follows what pickling follows: container
items, instance ``__dict__`` and ``__slots__``, closure cells, and, for anything else, the
objects the garbage collector says it refers to (shown as ``→ type``: they have no name).

Paths are in the program's own words: the walk starts from the program's names (and from
what the caller names for it: a paused frame's locals, ``first``), and only what those do not
reach is looked for from internal roots (the engine's temporaries, the process segment),
whose names the caller can spell out (``label``: ``_sj_it7`` is "the loop `for p in
model.parameters()` (train.py:9)"). An object no walk reaches (a reducer made it) is named
by the variable it was found in.
"""

from __future__ import annotations

import gc
import io
import types
from collections import deque
from collections.abc import Callable, Iterator
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
        for ref in gc.get_referents(obj):
            if not isinstance(ref, type):
                yield f" → {type(ref).__qualname__}", ref


def internal(name: str) -> bool:
    """A root that is not one of the program's names: an engine temporary (``_sj_…``) or the
    capsule's process segment."""
    return name.startswith("_sj_") or name == "<process>"


def _walk(queue: deque[tuple[str, Any]], targets: set[int], found: dict[int, str], seen: set[int]) -> None:
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


def find_paths(roots: dict[str, Any], targets: set[int], *, first: dict[str, Any] | None = None,
               label: Callable[[str], str] | None = None) -> dict[int, str]:
    found: dict[int, str] = {}
    seen: set[int] = set()
    every = [*roots.items(), *(first or {}).items()]
    _walk(deque((n, v) for n, v in every if not internal(n)), targets, found, seen)
    if len(found) < len(targets):
        # What the program's names do not reach, from the internal roots (a second walk: the
        # objects the first one saw are not visited again, so its paths stay the short ones).
        rest = [((label(n) if label else n), v) for n, v in every if internal(n)]
        _walk(deque(rest), targets, found, seen)
    return found


def problems_with_paths(roots: dict[str, Any], raw: list[tuple[Any, str]], *, first: dict[str, Any] | None = None,
                        label: Callable[[str], str] | None = None,
                        found_in: dict[int, str] | None = None) -> list[Problem]:
    """``raw`` (object, reason) as problems named by a path from ``roots`` (see above);
    ``found_in``: the variable each object was found in, for those no walk reaches."""
    paths = find_paths(roots, {id(o) for o, _ in raw}, first=first, label=label)
    out: list[Problem] = []
    seen: set[int] = set()
    for obj, reason in raw:
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        path = paths.get(id(obj))
        if path is None:
            root = (found_in or {}).get(id(obj))
            shown = (label(root) if label and internal(root) else root) if root is not None else None
            path = f"(inside {shown})" if shown is not None else "(an object no variable refers to)"
        out.append(Problem(path, type_name(type(obj)), reason))
    out.sort(key=lambda p: p.path)
    return out


def scan(namespace: dict[str, Any], *, first: dict[str, Any] | None = None,
         label: Callable[[str], str] | None = None, rehearse: bool = True) -> list[Problem]:
    """Every object in ``namespace`` that cannot travel, and (``rehearse``) every variable a
    capsule's write check would refuse because it comes back different; writes nothing.
    (``first`` and ``label``: see :func:`find_paths`.)"""
    from sojourn.capsule import reducers  # noqa: F401
    from sojourn.capsule.capture import skipped

    ctx = CaptureContext(namespace=namespace)
    pickler = CapsulePickler(_NullSink(), ctx)  # type: ignore[arg-type]
    roots = {n: v for n, v in namespace.items() if isinstance(n, str) and not skipped(n)}
    for name, value in roots.items():
        ctx.current_root = name
        pickler.dump(value)
    problems = problems_with_paths(roots, ctx.problems, first=first, label=label, found_in=ctx.problem_roots)
    if rehearse and not problems:
        from sojourn.capsule import probe

        problems = differences(roots, probe.rehearse(roots), label)
    return problems


def differences(roots: dict[str, Any], found: list[tuple[str, str]] | None,
                label: Callable[[str], str] | None = None) -> list[Problem]:
    """The rehearsed write check's findings (:mod:`sojourn.capsule.probe`) as problems."""
    out = []
    for name, where in found or ():
        shown = label(name) if label is not None and internal(name) else name
        out.append(Problem(shown + where, type_name(type(roots[name])), (
            "it comes back different from a capsule (its own pickling does not rebuild it as "
            "it was), so the capsule's write check would refuse it; keep what it is made of in "
            "plain values (or del it) before the pause, and report the type: it needs a reducer")))
    return out


class _NullSink(io.RawIOBase):
    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        return len(b)
