"""Reducers for standard-library objects that pickle cannot handle or handles wrongly."""

from __future__ import annotations

import gc
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
    if sys.modules.get(name) is not obj and not getattr(obj, "__file__", None):
        # types.ModuleType(name) filled by exec(): importing the name on the destination
        # would give another module, or none.
        return pickler.problem(
            obj, f"module {name!r} was made at run time (it has no file and is not the module "
                 f"sys.modules[{name!r}]), so the destination cannot import it; put its code in a "
                 "file of the workspace, or capture its contents instead")
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
#
# A view's ``mapping`` is a read-only proxy; the dict itself is the view's one referent, so
# the view is rebuilt on the restored dict (an alias of it elsewhere stays an alias). The
# same functions serve OrderedDict's views: ``d.keys()`` of an OrderedDict is an odict_keys.


def _dict_keys(d: dict[Any, Any]) -> Any:
    return d.keys()


def _dict_values(d: dict[Any, Any]) -> Any:
    return d.values()


def _dict_items(d: dict[Any, Any]) -> Any:
    return d.items()


def _viewed(obj: Any) -> Any:
    referents = gc.get_referents(obj)
    return referents[0] if len(referents) == 1 else dict(obj.mapping)


@register("builtins.dict_keys", "builtins.odict_keys")
def _dict_keys_reduce(obj: Any, pickler: Any) -> Any:
    return (_dict_keys, (_viewed(obj),))


@register("builtins.dict_values", "builtins.odict_values")
def _dict_values_reduce(obj: Any, pickler: Any) -> Any:
    return (_dict_values, (_viewed(obj),))


@register("builtins.dict_items", "builtins.odict_items")
def _dict_items_reduce(obj: Any, pickler: Any) -> Any:
    return (_dict_items, (_viewed(obj),))


# -- the standard streams: the destination's own ------------------------------------------


def _std_stream(name: str) -> Any:
    return getattr(sys, name)


def std_stream_reduce(obj: Any) -> Any:
    """For the files reducer: sys.stdout & co. travel as "this process's sys.stdout"."""
    for name in ("stdout", "stderr", "stdin", "__stdout__", "__stderr__", "__stdin__"):
        if getattr(sys, name, None) is obj:
            return (_std_stream, (name.strip("_"),))
    return None


# -- mappingproxy: over the same mapping ------------------------------------------------
#
# A proxy over a dict of the program is rebuilt over that dict (restored once, so changes to
# it still show through the proxy). A class's ``__dict__`` is a proxy over the type's own
# namespace, which no program holds otherwise: that travels as a copy.


def _mappingproxy(mapping: Any) -> types.MappingProxyType[Any, Any]:
    return types.MappingProxyType(mapping)


@register("builtins.mappingproxy")
def _mappingproxy_reduce(obj: Any, pickler: Any) -> Any:
    referents = gc.get_referents(obj)
    inner = referents[0] if len(referents) == 1 else dict(obj)
    return (_mappingproxy, (inner,))


# -- builtin descriptors and the types of builtin singletons ---------------------------------


def _class_attr(cls: type, name: str) -> Any:
    return cls.__dict__[name]


@register("builtins.getset_descriptor", "builtins.member_descriptor", "builtins.wrapper_descriptor",
          "builtins.method_descriptor", "builtins.classmethod_descriptor")
def _descriptor_reduce(obj: Any, pickler: Any) -> Any:
    # float.real, int.__add__, a slot of a class: the entry of its class's namespace
    owner = getattr(obj, "__objclass__", None)
    name = getattr(obj, "__name__", None)
    if isinstance(owner, type) and isinstance(name, str) and owner.__dict__.get(name) is obj:
        return (_class_attr, (owner, name))
    return pickler.problem(obj, f"a descriptor that is not the attribute {name!r} of its class {owner!r}")


# -- memoryview: its bytes, out of band -------------------------------------------------------


def _memoryview(data: bytearray, fmt: str, shape: tuple[int, ...]) -> memoryview:
    view = memoryview(bytes(data))  # a view of bytes, as it was
    if fmt != "B" or len(shape) != 1:
        view = view.cast(fmt, shape) if shape else view.cast(fmt)  # type: ignore[call-overload]
    return view


@register("builtins.memoryview")
def _memoryview_reduce(obj: memoryview, pickler: Any) -> Any:
    """A memoryview of bytes travels as a copy of the bytes it shows (format and shape
    kept). A view of a buffer the program can change would lose its link to it: refused."""
    base = obj.obj
    if not isinstance(base, bytes):
        return pickler.problem(
            obj, f"a memoryview of a {type(base).__name__} shares that object's memory, and a copy would not "
                 "see its later changes; keep the object itself (or bytes(view)) instead of the view")
    data = bytearray(obj.tobytes())
    return (_memoryview, (pickler.out_of_band(data), obj.format, obj.shape))


# -- weak references: to what the capsule carries ---------------------------------------------
#
# A weak reference comes back as a weak reference to the restored object. What else kept
# that object alive must be in the capsule too; if not, it dies as soon as it is restored, and
# the fingerprint check (the set or the reference is then empty) refuses the restore.


def _weakset(items: set[Any]) -> Any:
    import weakref

    return weakref.WeakSet(items)


@register("_weakrefset.WeakSet")
def _weakset_reduce(obj: Any, pickler: Any) -> Any:
    return (_weakset, (set(obj),))  # a set: its order is not the program's, nor compared


def _weakref(target: Any, callback: Any) -> Any:
    import weakref

    return weakref.ref(target, callback)


@register("weakref.ReferenceType")
def _weakref_reduce(obj: Any, pickler: Any) -> Any:
    target = obj()
    if target is None:
        return pickler.problem(obj, "a weak reference to an object that no longer exists cannot be "
                               "rebuilt anywhere; drop it (or set it to None) before the pause")
    return (_weakref, (target, obj.__callback__))
