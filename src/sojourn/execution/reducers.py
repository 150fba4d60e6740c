"""Reducers for the program's own functions, classes and generators (registered in the one
reducer table of :mod:`sojourn.capsule.registry`).

* A function or class of a transformed module that its module binds under its qualified name
  travels **by name** and is found again in the resumed module, so the object is the very one
  the resumed code uses (``isinstance`` holds, identity holds). In the main script that is
  true only of top-level definitions made before the paused statement: those are defined
  again before the capsule is restored.
* Any other function of transformed code (a closure, a redefined or conditional def) travels
  as (module, scope, cells, defaults): the code is taken from the resumed module's own
  transform, so it keeps its pause points. Bytecode never travels.
* A generator of transformed code travels as a frame record (statement id, mode, locals) and
  is rebuilt by calling a *variant* of its function that restores the locals and stops once
  at :data:`~sojourn.execution.runtime.BOOT` exactly where the original was (see
  :mod:`resumeform`). Generators that are not the program's own (library generators,
  generator expressions) and coroutines are refused, each with its own reason.

Anything else is left to :mod:`sojourn.capsule.reducers.code`, unchanged.
"""

from __future__ import annotations

import enum
import inspect
import types
import weakref
from typing import Any

from sojourn.capsule.reducers import code as code_reducers
from sojourn.capsule.registry import register
from sojourn.execution.position import FrameRecord, Position, frame_locals, span_at
from sojourn.execution.runtime import BOOT, RUNTIME, TransformedModule

# What the current capture knows about frames on the stack (set by the pause controller).
_CAPTURE: Position | None = None
_USED: set[int] = set()

# Generators rebuilt in this process that have not moved since: they reduce to the record they
# were rebuilt from (the fixpoint a fingerprint check needs). Value: [record, f_lasti or None].
_REBUILT: weakref.WeakKeyDictionary[types.GeneratorType, list[Any]] = weakref.WeakKeyDictionary()
_PENDING: list[types.GeneratorType] = []


def set_capture(position: Position | None) -> None:
    global _CAPTURE
    _CAPTURE = position
    _USED.clear()


def unused_running() -> list[FrameRecord]:
    if _CAPTURE is None:
        return []
    return [r for k, r in _CAPTURE.running.items() if k not in _USED]


# -- by name ------------------------------------------------------------------------------------


def _lookup(ns: dict[str, Any], qualname: str) -> Any:
    parts = qualname.split(".")
    if "<locals>" in parts or parts[0] not in ns:
        return None
    obj = ns[parts[0]]
    for p in parts[1:]:
        obj = getattr(obj, p, None)
        if obj is None:
            return None
    return obj


def _by_name(obj: Any, tm: TransformedModule) -> bool:
    if _lookup(tm.namespace, obj.__qualname__) is not obj:
        return False
    if tm is RUNTIME.main:
        return obj.__qualname__.split(".")[0] in RUNTIME.main_definitions
    return True


def _named(module: str, qualname: str) -> Any:
    tm = RUNTIME.module(module)
    obj = _lookup(tm.namespace, qualname)
    if obj is None:
        raise LookupError(f"{qualname} is not defined in the resumed module {module}")
    return obj


# -- functions and classes ------------------------------------------------------------------------


def _make_function(module: str, scope: str, name: str, qualname: str, cells: dict[str, Any]) -> types.FunctionType:
    tm = RUNTIME.module(module)
    code = tm.scope_code[scope]
    closure = tuple(cells[n] if n in cells else types.CellType() for n in code.co_freevars)
    fn = types.FunctionType(code, tm.namespace, name, None, closure or None)
    fn.__qualname__ = qualname
    return fn


@register("builtins.function")
def _function_reduce(fn: types.FunctionType, pickler: Any) -> Any:
    info = RUNTIME.scope_of(fn.__code__)
    if info is None or info[1] == "<module>":
        return code_reducers.reduce_function(fn, pickler)
    tm, scope = info
    if _by_name(fn, tm):
        return (_named, (tm.name, fn.__qualname__))
    cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=False))
    state: dict[str, Any] = {}
    if fn.__defaults__ is not None:
        state["__defaults__"] = fn.__defaults__
    if fn.__kwdefaults__:
        state["__kwdefaults__"] = fn.__kwdefaults__
    if fn.__dict__:
        state["__dict__"] = fn.__dict__
    if fn.__annotations__:
        state["__annotations__"] = fn.__annotations__
    if fn.__module__ != tm.namespace.get("__name__"):
        state["__module__"] = fn.__module__
    return (_make_function, (tm.name, scope, fn.__name__, fn.__qualname__, cells), state or None,
            None, None, code_reducers._function_setstate if state else None)


def _class_data(cls: type) -> dict[str, Any]:
    """A class's data attributes (``Section.depth``): they change while a program runs, and a
    class found again by name in the resumed module has only the values of its definition."""
    if isinstance(cls, enum.EnumMeta):
        return {}
    out = {}
    for k, v in vars(cls).items():
        if k.startswith("__") and k.endswith("__"):
            continue
        if isinstance(v, types.FunctionType | staticmethod | classmethod | property | type) or hasattr(type(v), "__get__"):
            continue
        out[k] = v
    return out


def _class_setstate(cls: type, state: dict[str, Any]) -> None:
    for k, v in state.items():
        setattr(cls, k, v)


def _class_line(cls: type, tm: TransformedModule) -> int | None:
    """The first line of the class statement that made ``cls`` (one of several with its name:
    the one whose lines hold one of its methods)."""
    spans = tm.layout.classes.get(cls.__qualname__, [])
    if len(spans) == 1:
        return spans[0][0]
    for v in vars(cls).values():
        fn = getattr(v, "__func__", v)
        code = getattr(fn, "__code__", None)
        if code is not None and RUNTIME.scope_of(code) is not None:
            for first, last in spans:
                if first <= code.co_firstlineno <= last:
                    return first
    return None


def _make_class(module: str, qualname: str, first: int) -> type:
    """Run the class statement again, from the module's transformed source (its methods keep
    their pause points); the module's binding of the name is left as it was."""
    from sojourn.execution.resumeform import class_code

    tm = RUNTIME.module(module)
    ns = tm.namespace
    name = qualname.rpartition(".")[2]
    missing = object()
    before = ns.get(name, missing)
    try:
        exec(class_code(tm, qualname, first), ns)
        cls = ns[name]
    finally:
        if before is missing:
            ns.pop(name, None)
        else:
            ns[name] = before
    return cls  # type: ignore[no-any-return]


@register("builtins.type", "abc.ABCMeta", "enum.EnumType", "typing._ProtocolMeta")
def _class_reduce(cls: type, pickler: Any) -> Any:
    tm = RUNTIME.modules.get(cls.__module__)
    if tm is None:
        return code_reducers.reduce_class(cls, pickler)
    data = _class_data(cls)
    state = (data, None, None, _class_setstate) if data else ()
    if _by_name(cls, tm):
        return (_named, (tm.name, cls.__qualname__), *state)
    first = _class_line(cls, tm)
    if "<locals>" in cls.__qualname__.split(".") or "." in cls.__qualname__ or first is None:
        return pickler.problem(cls, f"class {cls.__qualname__} of {tm.filename} is defined inside a function "
                                    "or another class; define it at the top level of its module to carry it")
    return (_make_class, (tm.name, cls.__qualname__, first), *state)


# Classes made by any other metaclass (torch.autograd.Function's FunctionMeta, a library's
# model metaclass...) come here too: the program's own travel by name or from its transform,
# the others as before (the capsule's class reducer).
register("builtins.type", subclasses=True)(_class_reduce)


# -- generators -------------------------------------------------------------------------------------


def _make_generator(rec: FrameRecord) -> types.GeneratorType:
    from sojourn.execution.resumeform import variant_args, variant_function

    fn = variant_function(RUNTIME, rec)
    g = fn(*variant_args(fn, rec))
    _REBUILT[g] = [rec, None]
    if rec.mode != "start":
        _PENDING.append(g)
    return g  # type: ignore[no-any-return]


def _make_closed_generator() -> types.GeneratorType:
    def closed() -> Any:
        yield  # pragma: no cover

    g = closed()
    g.close()
    return g


def prime_rebuilt() -> None:
    """Run every rebuilt generator up to its BOOT point (after the whole capsule is loaded).

    A generator paused inside ``yield from`` starts its delegate itself, so delegates wait.
    """
    pending = list(_PENDING)
    _PENDING.clear()
    delegates = set()
    for g in pending:
        rec = _REBUILT[g][0]
        if rec.mode == "yieldfrom" and rec.via == "gen":
            delegates.add(id(rec.gen))
    for g in pending:
        if id(g) in delegates or inspect.getgeneratorstate(g) != inspect.GEN_CREATED:
            continue
        value = next(g)
        if value is not BOOT:
            raise RuntimeError(f"generator {g.gi_code.co_qualname} was not rebuilt where it stopped")
    for g in pending:
        if g.gi_frame is not None and inspect.getgeneratorstate(g) == inspect.GEN_SUSPENDED:
            _REBUILT[g][1] = g.gi_frame.f_lasti


def _untouched(g: types.GeneratorType) -> FrameRecord | None:
    entry = _REBUILT.get(g)
    if entry is None:
        return None
    rec, lasti = entry
    state = inspect.getgeneratorstate(g)
    if lasti is None and state == inspect.GEN_CREATED:
        return rec  # type: ignore[no-any-return]
    if lasti is not None and state == inspect.GEN_SUSPENDED and g.gi_frame is not None and g.gi_frame.f_lasti == lasti:
        return rec  # type: ignore[no-any-return]
    return None


@register("builtins.generator")
def _generator_reduce(g: types.GeneratorType, pickler: Any) -> Any:
    from sojourn.execution.position import with_problems

    state = inspect.getgeneratorstate(g)
    if state == inspect.GEN_CLOSED:
        return (_make_closed_generator, ())
    info = RUNTIME.scope_of(g.gi_code)
    if info is None:
        what = "a generator expression" if g.gi_code.co_name == "<genexpr>" else f"generator {g.gi_code.co_qualname}"
        return pickler.problem(g, f"{what} is not a generator function of the program, so it cannot be "
                                  "resumed; use a list, or a generator function defined in the program")
    tm, scope = info
    rec = _untouched(g)
    if rec is not None:
        return (_make_generator, (rec,))
    frame = g.gi_frame
    assert frame is not None  # only a closed generator has none
    if _CAPTURE is not None and id(frame) in _CAPTURE.running:
        rec = _CAPTURE.running[id(frame)]
        _USED.add(id(frame))
    elif state == inspect.GEN_RUNNING:
        return pickler.problem(g, f"generator {g.gi_code.co_qualname} is running outside the paused stack")
    elif state == inspect.GEN_CREATED:
        loc, cells = frame_locals(frame, None)
        rec = FrameRecord(tm.name, scope, -1, "start", loc, cells, where=f"{tm.filename}: {g.gi_code.co_qualname} (not started)")
    else:
        pos = span_at(frame)
        site = tm.layout.sites.get((scope, pos)) if pos is not None else None
        if site is None or site.kind not in ("yield", "yieldfrom") or (scope, pos) in tm.layout.ambiguous:
            return pickler.problem(g, f"generator {g.gi_code.co_qualname} stopped at a yield inside an "
                                      "expression, which cannot be resumed")
        loc, cells = frame_locals(frame, None)
        rec = FrameRecord(tm.name, scope, site.sid, site.kind, loc, cells, where=tm.layout.where(site.sid))
        if site.kind == "yieldfrom":
            delegate = loc.get(site.itvar or "")
            own = isinstance(delegate, types.GeneratorType) and RUNTIME.scope_of(delegate.gi_code) is not None
            rec.via, rec.gen = ("gen", delegate) if own else ("iter", None)
        for cm, reason in with_problems(tm, rec.sid, loc):
            pickler.problem(cm, f"{reason} (in generator {g.gi_code.co_qualname}, {rec.where})")
    return (_make_generator, (rec,))


def _async_refused(obj: Any, pickler: Any) -> Any:
    code = getattr(obj, "cr_code", None) or getattr(obj, "ag_code", None)
    name = code.co_qualname if code is not None else type(obj).__name__
    return pickler.problem(obj, f"{name} is a coroutine (async def); sojourn cannot pause or carry "
                                "coroutines: finish or cancel it before the pause")


register("builtins.coroutine", "builtins.async_generator")(_async_refused)
