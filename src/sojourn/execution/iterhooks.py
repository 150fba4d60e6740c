"""The ``for``-iterator hook: how a loop's iterator is made, so that special ones can travel.

Every ``for`` in transformed code gets its iterator from ``__sojourn_iter__(iterable)`` (and
``for x in enumerate(it)`` / ``zip(a, b)`` pass their iterables through it first). A hook
registered for a type (by ``module.qualname``, matched along the MRO, nothing imported early)
makes the iterator instead, e.g. a DataLoader iterator that records the RNG state it starts
from, or a tqdm bar's iterator rebuilt as an object that can be pickled.

Until a module that defines a hooked type is imported, ``__sojourn_iter__`` is the builtin
``iter`` itself, so a program that never imports torch or tqdm pays nothing: an import
watcher (first on ``sys.meta_path``, it finds nothing itself) switches every transformed
module to the hooked function when such a module is first imported.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Iterator
from typing import Any

IterHook = Callable[[Any], Iterator[Any]]

_HOOKS: dict[str, IterHook] = {}
_MODULES: set[str] = set()  # the modules that define hooked types
_BY_TYPE: dict[type, IterHook | None] = {}
_armed = False


def register_iter_hook(type_name: str, hook: IterHook, module: str | None = None) -> None:
    """Make ``hook(obj)`` the iterator of every ``for`` over an instance of ``type_name``
    (``module`` defines it; by default, what precedes the last dot)."""
    if type_name in _HOOKS and _HOOKS[type_name] is not hook:
        raise RuntimeError(f"two iterator hooks registered for {type_name}")
    _HOOKS[type_name] = hook
    _MODULES.add(module or type_name.rpartition(".")[0])
    _BY_TYPE.clear()
    _refresh()


def _refresh() -> None:
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


def active() -> bool:
    return bool(_HOOKS) and (_armed or any(m in sys.modules for m in _MODULES))


def iter_function() -> Callable[[Any], Iterator[Any]]:
    return _iter_with_hooks if active() else iter


class _ImportWatch(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        global _armed
        if not _armed and fullname in _MODULES:
            _armed = True
            _refresh()
        return None


def watch() -> None:
    """Switch to the hooked iterator function when a hooked type's module is imported."""
    for f in list(sys.meta_path):
        if isinstance(f, _ImportWatch):
            sys.meta_path.remove(f)
    sys.meta_path.insert(0, _ImportWatch())
    _refresh()
