"""Classes that no class statement made, and library objects that pickle cannot name.

A class travels as its source (:mod:`sojourn.capsule.reducers.code`) when a class statement
made it. Classes made by a call instead have no source, but the call that made them is known
and is portable across Python versions, so that call travels with its arguments:

* ``collections.namedtuple(...)`` (also the classes libraries make with it, such as pandas'
  ``itertuples()`` rows) and functional ``typing.NamedTuple(...)``;
* the functional API of enums, ``Enum("Color", {"RED": 1})``;
* ``dataclasses.make_dataclass(...)``;
* anything else made by calling its metaclass (``type(...)``, ``abc.ABCMeta(...)``,
  ``types.new_class``): the metaclass is called with the name and bases, then the class
  dictionary is set (so a class that refers to itself, ``C.again = C``, can travel).

Library objects pickle refers to by a name that does not resolve travel another way:
``type(None)`` and the other singletons' types, types only the ``types`` module names
(``types.MappingProxyType``), pathlib's classes and paths (``pathlib._local.PosixPath`` on
3.13 is ``pathlib.PosixPath`` on 3.12), and ``TypeVar`` s made in a function.
"""

from __future__ import annotations

import abc
import collections
import dataclasses
import enum
import sys
import types
import typing
from typing import Any

from sojourn.capsule.registry import register
from sojourn.capsule.source import lookup

_SINGLETON_TYPES = {type(None): None, type(Ellipsis): Ellipsis, type(NotImplemented): NotImplemented}


def library_class(cls: type, pickler: Any) -> Any:
    """A reduce tuple for a library class pickle cannot find by its own name, or None."""
    if cls in _SINGLETON_TYPES:
        return (type, (_SINGLETON_TYPES[cls],))
    for name, value in vars(types).items():
        if value is cls and not name.startswith("_"):
            return (getattr, (types, name))
    return None


# Packages whose classes live in another submodule on another Python version (pathlib's are
# in pathlib._local on 3.13): their classes travel as "the package's attribute", the same
# stream on every version, so a capsule restores, and checks, on each.
_MOVING = ("pathlib",)


def public_home(module: str, qualname: str, cls: type) -> types.ModuleType | None:
    """The package a class of a moving package is taken from, by its public name."""
    top = module.partition(".")[0]
    if top not in _MOVING or "." in qualname:
        return None
    mod = sys.modules.get(top)
    return mod if mod is not None and getattr(mod, qualname, None) is cls else None


def _path(cls: type, text: str) -> Any:
    return cls(text)


@register(*(f"{m}.{n}" for m in ("pathlib", "pathlib._local") for n in (
    "PurePath", "PurePosixPath", "PureWindowsPath", "Path", "PosixPath", "WindowsPath")))
def _path_reduce(obj: Any, pickler: Any) -> Any:
    # Each version pickles a path with other arguments (its parts, its string): the string.
    return (_path, (type(obj), str(obj)))


# -- namedtuple --------------------------------------------------------------------------------


def _is_namedtuple(cls: type) -> bool:
    return (cls.__bases__ == (tuple,) and isinstance(vars(cls).get("_fields"), tuple)
            and "_make" in vars(cls) and "__new__" in vars(cls))


def _make_namedtuple(name: str, fields: tuple[str, ...], defaults: tuple[Any, ...] | None,
                     module: str, qualname: str) -> type:
    cls = collections.namedtuple(name, fields, defaults=defaults, module=module)  # type: ignore[misc]
    cls.__qualname__ = qualname
    return cls


def _namedtuple_reduce(cls: Any, pickler: Any) -> Any:
    fields = cls._fields
    defaults = tuple(cls._field_defaults[f] for f in fields if f in cls._field_defaults) or None
    fresh = collections.namedtuple(cls.__name__, fields, defaults=defaults)  # type: ignore[misc]
    made = set(vars(fresh))
    # What the program added or changed after the call (a docstring, a method, annotations
    # from typing.NamedTuple's functional form): set again on the new class.
    state = {k: v for k, v in sorted(vars(cls).items())
             if k not in made or (k == "__doc__" and v != fresh.__doc__)}
    state.pop("__module__", None)
    state.pop("__qualname__", None)
    return (_make_namedtuple, (cls.__name__, fields, defaults, cls.__module__, cls.__qualname__),
            state, None, None, _set_attrs)


def _set_attrs(cls: type, state: dict[str, Any]) -> None:
    for k, v in register_virtual(cls, state).items():
        setattr(cls, k, v)


# -- enums made by the functional API ----------------------------------------------------------


def _make_enum(base: Any, name: str, members: list[tuple[str, Any]], module: str, qualname: str) -> type:
    return base(name, members, module=module, qualname=qualname)  # type: ignore[no-any-return]


def _enum_reduce(cls: Any, pickler: Any) -> Any:
    bases = cls.__bases__
    if len(bases) != 1 or not isinstance(bases[0], enum.EnumMeta) or bases[0].__members__:
        return None
    members = [(k, m._value_) for k, m in cls.__members__.items()]
    return (_make_enum, (bases[0], cls.__name__, members, cls.__module__, cls.__qualname__))


# -- dataclasses.make_dataclass ----------------------------------------------------------------

_FIELD_OPTIONS = ("default", "default_factory", "init", "repr", "hash", "compare", "metadata", "kw_only")
_PARAMS = ("init", "repr", "eq", "order", "unsafe_hash", "frozen")


def _make_dataclass(name: str, spec: list[tuple[str, Any, dict[str, Any]]], bases: tuple[type, ...],
                    params: dict[str, Any], module: str, qualname: str) -> type:
    fields = [(n, t, dataclasses.field(**opts)) for n, t, opts in spec]
    cls = dataclasses.make_dataclass(name, fields, bases=bases, **params)
    cls.__module__ = module
    cls.__qualname__ = qualname
    return cls


def _dataclass_reduce(cls: Any, pickler: Any) -> Any:
    params_obj = vars(cls).get("__dataclass_params__")
    if params_obj is None:
        return None
    spec = []
    for f in dataclasses.fields(cls):
        opts = {}
        for k in _FIELD_OPTIONS:
            v = getattr(f, k, dataclasses.MISSING)
            if v is not dataclasses.MISSING and not (k == "metadata" and not v):
                opts[k] = dict(v) if k == "metadata" else v
        spec.append((f.name, f.type, opts))
    params = {k: getattr(params_obj, k) for k in _PARAMS}
    bases = tuple(b for b in cls.__bases__ if b is not object)
    try:
        fresh = _make_dataclass(cls.__name__, spec, bases, params, cls.__module__, cls.__qualname__)
    except Exception:  # a field this sojourn cannot express: the generic path refuses it by name
        return None
    made = set(vars(fresh))
    state = {k: v for k, v in sorted(vars(cls).items()) if k not in made}
    return (_make_dataclass, (cls.__name__, spec, bases, params, cls.__module__, cls.__qualname__),
            state, None, None, _set_attrs)


# -- any other class made by calling its metaclass ---------------------------------------------

_SKIP = ("__dict__", "__weakref__", "_abc_impl", "__module__", "__qualname__", "__name__")


def _make_type(meta: type, name: str, bases: tuple[type, ...], skeleton: dict[str, Any]) -> type:
    return meta(name, bases, dict(skeleton))


def _type_setstate(cls: type, state: dict[str, Any]) -> None:
    for k, v in register_virtual(cls, state).items():
        try:
            setattr(cls, k, v)
        except (AttributeError, TypeError):
            pass  # read-only on this class (a slot of a builtin type)
    if isinstance(cls, abc.ABCMeta):
        abc.update_abstractmethods(cls)  # type: ignore[arg-type]  # computed when the class was made, from what it held


def _generic_reduce(cls: type, pickler: Any) -> Any:
    meta = type(cls)
    ns = vars(cls)
    skeleton: dict[str, Any] = {"__module__": cls.__module__, "__qualname__": cls.__qualname__}
    if "__slots__" in ns:
        skeleton["__slots__"] = ns["__slots__"]
    state = {}
    for k, v in ns.items():
        if k in _SKIP or k in skeleton:
            continue
        if isinstance(v, types.MemberDescriptorType) and k in _slot_names(ns.get("__slots__")):
            continue
        state[k] = v
    if "__doc__" in state and state["__doc__"] is None:
        del state["__doc__"]
    # Sorted: the metaclass puts its own entries first on the restored class, so the order
    # of the class dict is not the captured one.
    state = dict(sorted(state.items()))
    registered = abc_registered(cls)
    if registered:
        state[REGISTERED] = registered
    return (_make_type, (meta, cls.__name__, cls.__bases__, skeleton), state, None, None, _type_setstate)


def _slot_names(slots: Any) -> tuple[str, ...]:
    if isinstance(slots, str):
        return (slots,)
    return tuple(slots) if slots else ()


def class_without_source(cls: type, pickler: Any) -> Any:
    """A reduce tuple for a class no class statement made (None: the caller refuses it)."""
    pickler.keepalive(cls)  # its id marks it as travelling by value (code._owner_of)
    pickler.__dict__.setdefault("_sojourn_by_value", set()).add(id(cls))
    if isinstance(cls, enum.EnumMeta):
        return _enum_reduce(cls, pickler)
    if _is_namedtuple(cls):
        return _namedtuple_reduce(cls, pickler)
    if "__dataclass_params__" in vars(cls):
        return _dataclass_reduce(cls, pickler)
    if type(cls) is type or isinstance(cls, abc.ABCMeta):
        return _generic_reduce(cls, pickler)
    return None


# -- abstract classes' virtual subclasses --------------------------------------------------------

REGISTERED = "__sojourn_abc_registered__"  # a key of a class's state: Base.register(...) calls


def abc_registered(cls: type) -> list[type]:
    """The classes registered as virtual subclasses of an abstract class (``Base.register(tuple)``),
    in a stable order. They live in its ``_abc_impl``, which pickles as nothing."""
    if "_abc_impl" not in vars(cls):
        return []
    try:
        refs = abc._get_dump(cls)[0]  # type: ignore[attr-defined]
    except (AttributeError, TypeError):
        return []
    found = [r() for r in refs]
    return sorted((c for c in found if isinstance(c, type)), key=lambda c: (c.__module__, c.__qualname__, id(c)))


def register_virtual(cls: type, state: dict[str, Any]) -> dict[str, Any]:
    """``state`` without the registrations, which are made on ``cls``."""
    if REGISTERED not in state:
        return state
    state = dict(state)
    for c in state.pop(REGISTERED):
        cls.register(c)  # type: ignore[attr-defined]
    return state


# -- TypeVar -------------------------------------------------------------------------------------


def _make_typevar(name: str, constraints: tuple[Any, ...], options: dict[str, Any], module: str) -> Any:
    tv = typing.TypeVar(name, *constraints, **options)  # type: ignore[misc]
    try:
        tv.__module__ = module
    except (AttributeError, TypeError):
        pass
    return tv


@register("typing.TypeVar")
def _typevar_reduce(obj: Any, pickler: Any) -> Any:
    module = getattr(obj, "__module__", None)
    if isinstance(module, str) and module != "__main__" and lookup(module, obj.__name__) is obj:
        pickler.note_module(module)
        return NotImplemented  # a module's own TypeVar: by name
    options = {"bound": obj.__bound__, "covariant": obj.__covariant__, "contravariant": obj.__contravariant__}
    return (_make_typevar, (obj.__name__, obj.__constraints__, options, module or "typing"))
