"""Reducers for standard-library objects that pickle cannot handle or handles wrongly."""

from __future__ import annotations

import importlib
import sys
import threading
import types
from typing import Any

from sojourn.capsule.registry import register

# -- modules: by name ---------------------------------------------------------------------


def _import_module(name: str) -> types.ModuleType:
    return importlib.import_module(name)


@register("builtins.module")
def _module_reduce(obj: types.ModuleType, pickler: Any) -> Any:
    name = obj.__name__
    if name == "__main__":
        return pickler.problem(
            obj, "the __main__ module itself cannot be captured; capture its namespace instead"
        )
    from sojourn.capsule.reducers.code import reduce_workspace_module

    workspace = reduce_workspace_module(name, pickler)  # its source travels; rebuilt if gone
    if workspace is not None:
        return workspace
    pickler.note_module(name)
    return (_import_module, (name,))


# -- locks: a free lock travels as a new free lock; a held one does not travel -------------


def _make_lock() -> Any:
    return threading.Lock()


def _make_rlock() -> Any:
    return threading.RLock()


@register("_thread.lock")
def _lock_reduce(obj: Any, pickler: Any) -> Any:
    if obj.locked():
        return pickler.problem(obj, "a lock held at capture time cannot be released elsewhere")
    return (_make_lock, ())


@register("_thread.RLock")
def _rlock_reduce(obj: Any, pickler: Any) -> Any:
    # RLock has no public "is held" query; its repr says "locked" or "unlocked".
    if "unlocked" not in repr(obj):
        return pickler.problem(obj, "a re-entrant lock held at capture time cannot travel")
    return (_make_rlock, ())


# -- dict views: the live view of the same dict -------------------------------------------


def _dict_keys(d: dict[Any, Any]) -> Any:
    return d.keys()


def _dict_values(d: dict[Any, Any]) -> Any:
    return d.values()


def _dict_items(d: dict[Any, Any]) -> Any:
    return d.items()


@register("builtins.dict_keys")
def _dict_keys_reduce(obj: Any, pickler: Any) -> Any:
    return (_dict_keys, (obj.mapping,))


@register("builtins.dict_values")
def _dict_values_reduce(obj: Any, pickler: Any) -> Any:
    return (_dict_values, (obj.mapping,))


@register("builtins.dict_items")
def _dict_items_reduce(obj: Any, pickler: Any) -> Any:
    return (_dict_items, (obj.mapping,))


# -- the standard streams: the destination's own ------------------------------------------


def _std_stream(name: str) -> Any:
    return getattr(sys, name)


def std_stream_reduce(obj: Any) -> Any:
    """For the files reducer: sys.stdout & co. travel as "this process's sys.stdout"."""
    for name in ("stdout", "stderr", "stdin", "__stdout__", "__stderr__", "__stdin__"):
        if getattr(sys, name, None) is obj:
            return (_std_stream, (name.strip("_"),))
    return None


# -- mappingproxy (a class's __dict__): a copy -------------------------------------------


@register("builtins.mappingproxy")
def _mappingproxy_reduce(obj: Any, pickler: Any) -> Any:
    return (types.MappingProxyType, (dict(obj),))
