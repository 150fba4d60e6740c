"""What a class defined in a function needs from that function when its statement runs again.

A class statement inside a function reads the function's variables (its bases, decorators,
``__slots__ = slots``, methods' closures). On the destination the statement runs inside a
scaffold function whose parameters are those names (:mod:`sojourn.capsule.source`); their
values must come from what the class itself still holds: its methods' closure cells, its
bases, the attributes its statement assigned from them, its type parameters. And a method
that a decorator generated from a string (a dataclass's ``__init__``) travels as the
attribute of the class that holds it: the class statement makes it again.
"""

from __future__ import annotations

import ast
import gc
import sys
import types
import typing
from typing import Any

from sojourn.capsule.source import (
    Source,
    class_functions,
    function_source,
    is_library_file,
    is_library_module,
)


def enclosing_values(cls: type, src: Source) -> tuple[Any, ...] | str:
    if not src.freevars:
        return ()
    cells = class_cells(cls)
    bases = base_bindings(src, cls)
    values = []
    for name in src.freevars:
        if name in cells:
            try:
                values.append(cells[name].cell_contents)
                continue
            except ValueError:
                pass
        if name in bases:
            values.append(bases[name])
            continue
        kept = _kept_by_class(cls, src, name)
        if kept:
            values.append(kept[0])
            continue
        return (f"class {cls.__qualname__} uses {name!r} of the function that defines it when the "
                "class is created, and the class does not keep that value; define the class at "
                "module level, or make it an attribute of the class")
    return tuple(values)


def _kept_by_class(cls: type, src: Source, name: str) -> tuple[Any] | tuple[()]:
    """The value of an enclosing name that the class itself still holds: its statement
    assigned it to an attribute (``__slots__ = slots``, ``__module__ = name``), or it is a
    type parameter of a generic class (``class C(Generic[T])``)."""
    for p in getattr(cls, "__parameters__", ()):
        if isinstance(p, typing.TypeVar) and p.__name__ == name:
            return (p,)
    try:
        node = ast.parse("if 1:\n" + src.text if src.text[:1].isspace() else src.text).body[0]
    except SyntaxError:
        return ()
    if isinstance(node, ast.If):
        node = node.body[0]
    if not isinstance(node, ast.ClassDef):
        return ()
    ns = vars(cls)
    for stmt in node.body:
        if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
                and isinstance(stmt.value, ast.Name) and stmt.value.id == name and stmt.targets[0].id in ns):
            return (ns[stmt.targets[0].id],)
    return ()


def class_cells(cls: type) -> dict[str, types.CellType]:
    cells: dict[str, types.CellType] = {}
    for f in class_functions(cls):
        if is_library_file(f.__code__.co_filename):
            continue  # a library's wrapper (dataclass's recursive-repr guard): its cells are its own
        for name, cell in zip(f.__code__.co_freevars, f.__closure__ or (), strict=False):
            if name != "__class__":
                cells.setdefault(name, cell)
    return dict(sorted(cells.items()))


def base_bindings(src: Source, cls: type) -> dict[str, Any]:
    """Names in the class statement's bases (and metaclass) bound to what the class really has."""
    try:
        node = ast.parse("if 1:\n" + src.text if src.text[:1].isspace() else src.text).body[0]
    except SyntaxError:
        return {}
    if isinstance(node, ast.If):
        node = node.body[0]
    if not isinstance(node, ast.ClassDef):
        return {}
    out: dict[str, Any] = {}
    if "__orig_bases__" not in vars(cls) and len(node.bases) == len(cls.__bases__):
        for b, value in zip(node.bases, cls.__bases__, strict=True):
            if isinstance(b, ast.Name):
                out[b.id] = value
    for kw in node.keywords:
        if kw.arg == "metaclass" and isinstance(kw.value, ast.Name):
            out[kw.value.id] = type(cls)
    return out


def wraps_sourceless(func: types.FunctionType) -> bool:
    """A library's closure over a function that has no source (it would be refused)."""
    for cell in func.__closure__ or ():
        try:
            inner = cell.cell_contents
        except ValueError:
            continue
        if isinstance(inner, types.FunctionType) and isinstance(function_source(inner), str):
            return True
    return False


def held_by_class(func: types.FunctionType, pickler: Any) -> tuple[type, str] | None:
    """(class, attribute) of a class that holds ``func`` in its namespace (found through the
    garbage collector: only for a function that could not travel otherwise)."""
    by_value = pickler.__dict__.get("_sojourn_by_value", ())
    for ns in gc.get_referrers(func):
        if type(ns) is not dict:
            continue
        for cls in gc.get_referrers(ns):
            if isinstance(cls, type) and id(cls) not in by_value and not is_library_module(cls.__module__):
                for k, v in vars(cls).items():
                    if v is func:
                        return (cls, k)
    return None


# A key of a function's state: submodules its code reaches through a module it holds.
SUBMODULES = "__sojourn_submodules__"


def imported_submodules(func: types.FunctionType) -> list[types.ModuleType]:
    """Submodules the program imported that the function reaches by attribute through a module
    it holds (``xml.etree.ElementTree.Comment`` with ``xml`` in a closure cell or a global).

    A module travels as "import it", and ``import xml`` alone does not load ``xml.etree``:
    these travel with the function, so it finds them where it is restored. Only submodules
    every part of whose name the code uses, as cloudpickle does."""
    names = set(func.__code__.co_names)
    for c in func.__code__.co_consts:
        if isinstance(c, types.CodeType):
            names |= set(c.co_names)
    held: list[types.ModuleType] = []
    for cell in func.__closure__ or ():
        try:
            v = cell.cell_contents
        except ValueError:
            continue
        if isinstance(v, types.ModuleType):
            held.append(v)
    glb = func.__globals__
    held += [glb[n] for n in func.__code__.co_names if isinstance(glb.get(n), types.ModuleType)]
    found: dict[str, types.ModuleType] = {}
    for mod in held:
        prefix = mod.__name__ + "."
        for name, sub in list(sys.modules.items()):
            if (name.startswith(prefix) and isinstance(sub, types.ModuleType)
                    and all(part in names for part in name[len(prefix):].split("."))):
                found[name] = sub
    return [found[n] for n in sorted(found)]
