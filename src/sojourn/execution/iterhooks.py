"""The ``for``-iterator hook: how a loop's iterator is made, so that special ones can travel.

Every ``for`` in transformed code gets its iterator from ``__sojourn_iter__(iterable)``. With
no hook registered that name is the builtin ``iter`` itself (no cost). A hook registered for a
type (by ``module.qualname``, matched along the MRO, nothing imported early) makes the
iterator instead, e.g. a DataLoader iterator that records the RNG state it starts from, or a
tqdm bar's iterator rebuilt as an object that can be pickled.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

IterHook = Callable[[Any], Iterator[Any]]

_HOOKS: dict[str, IterHook] = {}
_BY_TYPE: dict[type, IterHook | None] = {}


def register_iter_hook(type_name: str, hook: IterHook) -> None:
    """Make ``hook(obj)`` the iterator of every ``for`` over an instance of ``type_name``."""
    if type_name in _HOOKS and _HOOKS[type_name] is not hook:
        raise RuntimeError(f"two iterator hooks registered for {type_name}")
    _HOOKS[type_name] = hook
    _BY_TYPE.clear()
    from sojourn.execution.runtime import RUNTIME

    RUNTIME.refresh_iter()


def _lookup(t: type) -> IterHook | None:
    try:
        return _BY_TYPE[t]
    except KeyError:
        pass
    hook = None
    for cls in t.__mro__:
        hook = _HOOKS.get(f"{cls.__module__}.{cls.__qualname__}")
        if hook is not None:
            break
    _BY_TYPE[t] = hook
    return hook


def _iter_with_hooks(obj: Any) -> Iterator[Any]:
    hook = _lookup(type(obj))
    return hook(obj) if hook is not None else iter(obj)


def iter_function() -> Callable[[Any], Iterator[Any]]:
    return _iter_with_hooks if _HOOKS else iter
