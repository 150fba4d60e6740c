"""The one dispatch table of reducers, keyed by type name so that nothing is imported early.

A reducer module registers ``"numpy.ndarray"`` without importing numpy; the table resolves a
type to its reducer the first time an object of that type is pickled and caches the answer
(a miss is cached too). A reducer has the signature ``reduce(obj, pickler) -> reduce tuple``
and may return ``NotImplemented`` to fall back to pickle's own rules. Matching is by exact
type unless the reducer is registered with ``subclasses=True`` (torch tensors and modules:
user subclasses must not fall back to the library's own, device-dependent pickling).

Buffer *allocators* live here as well: a reducer that hands a buffer out of band can name a
kind (``"ndarray"``) and metadata, and at restore time the allocator for that kind creates
the final object (an owning array of the right dtype and shape) before anything is
unpickled, so chunks are read straight into their final memory and checked there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Reducer = Callable[[Any, Any], Any]
# An allocator returns (object handed to the unpickler, writable byte view to fill).
Allocator = Callable[[dict[str, Any], int], tuple[Any, memoryview]]

_BY_NAME: dict[str, Reducer] = {}
_BY_TYPE: dict[type, Reducer | None] = {}
_FOR_SUBCLASSES: set[str] = set()
_ALLOCATORS: dict[str, Allocator] = {}


def type_name(t: type) -> str:
    return f"{t.__module__}.{t.__qualname__}"


def register(*names: str, subclasses: bool = False) -> Callable[[Reducer], Reducer]:
    """Register ``fn`` as the reducer for the types with these ``module.qualname`` names."""

    def deco(fn: Reducer) -> Reducer:
        for name in names:
            if name in _BY_NAME and _BY_NAME[name] is not fn:
                raise RuntimeError(f"two reducers registered for {name}")
            _BY_NAME[name] = fn
            if subclasses:
                _FOR_SUBCLASSES.add(name)
        _BY_TYPE.clear()
        return fn

    return deco


def register_allocator(kind: str) -> Callable[[Allocator], Allocator]:
    def deco(fn: Allocator) -> Allocator:
        if kind in _ALLOCATORS and _ALLOCATORS[kind] is not fn:
            raise RuntimeError(f"two allocators registered for {kind}")
        _ALLOCATORS[kind] = fn
        return fn

    return deco


def lookup(t: type) -> Reducer | None:
    try:
        return _BY_TYPE[t]
    except KeyError:
        pass
    r = _BY_NAME.get(type_name(t))
    if r is None and _FOR_SUBCLASSES:
        for base in t.__mro__[1:]:
            name = type_name(base)
            if name in _FOR_SUBCLASSES:
                r = _BY_NAME[name]
                break
    _BY_TYPE[t] = r
    return r


def allocator(kind: str) -> Allocator:
    try:
        return _ALLOCATORS[kind]
    except KeyError:
        raise KeyError(f"no allocator for buffer kind {kind!r}") from None


def registered_names() -> list[str]:
    return sorted(_BY_NAME)
