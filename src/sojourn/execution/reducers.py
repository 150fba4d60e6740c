"""Reducers for the program's own functions, classes and generators (registered in the one
reducer table of :mod:`sojourn.capsule.registry`).

No definition statement of the main script runs again on resume (its module code does not):
its functions and classes come back from the capsule, with the state they had.

* A function of a transformed module travels as (module, scope, cells) and its state
  (defaults, keyword defaults, attributes, annotations): the code is taken from the resumed
  module's own transform, so it keeps its pause points, and a default computed from a global
  keeps the value its ``def`` gave it. Bytecode never travels.
* A class is rebuilt by running its class statement again from the transformed source (its
  methods keep their pause points), with the names the statement reads (and the globals the
  program's own functions it calls read) bound to their values at capture; containers among
  them are copies while it runs, so a decorator that registers the class does not register
  it twice. The class then gets back its data attributes and its functions' defaults.
* A method or nested class reached through its class travels as that class's attribute, so
  ``C.method is f`` still holds.
* The other modules of the program run their module code again when imported: a function or
  class that its module binds under its qualified name travels **by name** (the state above
  is set back on it), so ``isinstance`` and identity hold.
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
from sojourn.capsule.reducers.code_library import abc_registered
from sojourn.capsule.registry import register
from sojourn.execution import cells as notebook_cells
from sojourn.execution.position import FrameRecord, Position, frame_locals, span_at
from sojourn.execution.runtime import BOOT, RUNTIME, TransformedModule

# What the current capture knows about frames on the stack (set by the pause controller),
# and where it lists the generators' frames (the capsule's label: a resume from an edited
# source checks them).
_CAPTURE: Position | None = None
_USED: set[int] = set()
_FRAMES: list[dict[str, Any]] | None = None

# Generators rebuilt in this process that have not moved since: they reduce to the record they
# were rebuilt from (the fixpoint a fingerprint check needs). Value: [record, f_lasti or None].
_REBUILT: weakref.WeakKeyDictionary[types.GeneratorType, list[Any]] = weakref.WeakKeyDictionary()
_PENDING: list[types.GeneratorType] = []
# Functions and classes of a source edited since the capture, made by this resume: how the
# capsule described them (their reduce arguments), and which parts of their state it set.
# While the resume's restore compares fingerprints, they reduce to that, not to what the
# edited code made (a new method and its defaults are not in the capsule).
_CAPTURED: weakref.WeakKeyDictionary[Any, tuple[Any, ...]] = weakref.WeakKeyDictionary()
_STATE_KEYS: weakref.WeakKeyDictionary[Any, set[Any]] = weakref.WeakKeyDictionary()


def _edited(obj: Any) -> bool:
    module = getattr(obj, "__module__", None)
    return isinstance(module, str) and module in RUNTIME.remaps


def _as_captured(obj: Any, state: dict[str, Any], nested: tuple[str, ...] = ()) -> dict[str, Any]:
    """``state`` cut to what the capsule set on ``obj`` (while a resume from an edited source
    compares fingerprints; otherwise ``state``). ``nested``: keys holding dicts to cut too."""
    if not (RUNTIME.as_captured and _edited(obj)):
        return state
    keys = _STATE_KEYS.get(obj, set())
    out = {}
    for k, v in state.items():
        if k in nested:
            v = {kk: vv for kk, vv in v.items() if (k, kk) in keys}
            if v:
                out[k] = v
        elif k in keys:
            out[k] = v
    return out


def _note_state(obj: Any, state: dict[str, Any], nested: tuple[str, ...] = ()) -> None:
    if _edited(obj):
        _STATE_KEYS[obj] = {(k, kk) for k in nested for kk in state.get(k, {})} | {k for k in state if k not in nested}


def _function_setstate(fn: types.FunctionType, state: dict[str, Any]) -> None:
    _note_state(fn, state)
    code_reducers._function_setstate(fn, state)


def set_capture(position: Position | None, frames: list[dict[str, Any]] | None = None) -> None:
    global _CAPTURE, _FRAMES
    _CAPTURE = position
    _FRAMES = frames
    _USED.clear()


def frame_entry(rec: FrameRecord) -> dict[str, Any]:
    """What a capsule's label says of a frame that carries on from a statement."""
    return {"module": rec.module, "scope": rec.scope, "sid": rec.sid, "where": rec.where}


def _listed(rec: FrameRecord) -> FrameRecord:
    if _FRAMES is not None:
        _FRAMES.append(frame_entry(rec))
    return rec


def unused_running() -> list[FrameRecord]:
    if _CAPTURE is None:
        return []
    return [r for k, r in _CAPTURE.running.items() if k not in _USED]


# -- by name, and through the owning class --------------------------------------------------------


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
    """Whether a module whose code runs again on import (not the main script) binds ``obj``
    under its qualified name."""
    return tm is not RUNTIME.main and not notebook_cells.is_cell(tm) and _lookup(tm.namespace, obj.__qualname__) is obj


def _named(module: str, qualname: str) -> Any:
    tm = RUNTIME.module(module)
    obj = _lookup(tm.namespace, qualname)
    if obj is None:
        raise LookupError(f"{qualname} is not defined in the resumed module {module}")
    return obj


_PARTS = ("", "__func__", "fget", "fset", "fdel")  # a class attribute itself, or what it wraps


def _owner(obj: Any, tm: TransformedModule) -> tuple[type, str, str] | None:
    """(class, attribute, part) through which the module reaches a method (also a static or
    class method, a property's function) or a nested class."""
    parts = obj.__qualname__.split(".")
    if len(parts) < 2 or "<locals>" in parts:
        return None
    owner = _lookup(tm.namespace, ".".join(parts[:-1]))
    if not isinstance(owner, type) or parts[-1] not in vars(owner):
        return None
    value = vars(owner)[parts[-1]]
    for part in _PARTS:
        if (getattr(value, part, None) if part else value) is obj:
            return owner, parts[-1], part
    return None


def _member(cls: type, name: str, part: str) -> Any:
    value = vars(cls)[name]
    return getattr(value, part) if part else value


# -- functions and classes ------------------------------------------------------------------------


def _remap(module: str) -> Any:
    return RUNTIME.remaps.get(module)


def _make_function(module: str, scope: str, name: str, qualname: str, cells: dict[str, Any],
                   *loaded: TransformedModule) -> types.FunctionType:
    # ``loaded``: a notebook cell's module, compiled again by its unpickling (notebook_cells)
    tm = RUNTIME.module(module)
    remap = _remap(module)
    code = tm.scope_code[remap.scope(scope) if remap is not None else scope]
    closure = tuple(cells[n] if n in cells else types.CellType() for n in code.co_freevars)
    fn = types.FunctionType(code, tm.namespace, name, None, closure or None)
    fn.__qualname__ = qualname
    if remap is not None:
        _CAPTURED[fn] = (module, scope, name, qualname, cells)
    return fn


def _function_state(fn: types.FunctionType, full: bool) -> dict[str, Any]:
    """What a function carries besides its code: what its ``def`` evaluated (defaults) and
    what the program set on it since. ``full`` adds what a rebuilt function would not have."""
    state: dict[str, Any] = {}
    if fn.__defaults__ is not None:
        state["__defaults__"] = fn.__defaults__
    if fn.__kwdefaults__:
        state["__kwdefaults__"] = fn.__kwdefaults__
    if fn.__dict__:
        state["__dict__"] = fn.__dict__
    if full and fn.__annotations__:
        state["__annotations__"] = fn.__annotations__
    return state


@register("builtins.function")
def _function_reduce(fn: types.FunctionType, pickler: Any) -> Any:
    info = RUNTIME.scope_of(fn.__code__)
    if info is None or info[1] == "<module>":
        return code_reducers.reduce_function(fn, pickler)
    tm, scope = info
    setstate = _function_setstate
    if _by_name(fn, tm):
        state = _as_captured(fn, _function_state(fn, False))
        return (_named, (tm.name, fn.__qualname__), state or None, None, None, setstate if state else None)
    owner = _owner(fn, tm)
    if owner is not None:
        return (_member, owner)
    captured = _CAPTURED.get(fn) if RUNTIME.as_captured else None
    cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=False))
    args = captured if captured is not None else (tm.name, scope, fn.__name__, fn.__qualname__, cells)
    if notebook_cells.is_cell(tm):
        args = (*args, tm)
    state = _function_state(fn, True)
    if fn.__module__ != tm.namespace.get("__name__"):
        state["__module__"] = fn.__module__
    state = _as_captured(fn, state)
    return (_make_function, args, state or None, None, None, setstate if state else None)


def _class_state(cls: type) -> dict[str, Any]:
    """What a class found again by name, or made again by its statement, would not have: its
    data attributes (``Section.depth``: they change while a program runs) and the defaults
    of its functions (evaluated when the class was made, from values that may have changed
    since: a dataclass's ``__init__`` too)."""
    if isinstance(cls, enum.EnumMeta):
        return {}
    data = {}
    defaults = {}
    registered = abc_registered(cls)
    for k, v in vars(cls).items():
        if k == "_abc_impl":
            continue  # its registrations travel as "registered"
        for part in _PARTS:
            f = getattr(v, part, None) if part else v
            if isinstance(f, types.FunctionType) and (f.__defaults__ is not None or f.__kwdefaults__):
                defaults[(k, part)] = (f.__defaults__, f.__kwdefaults__)
        if k.startswith("__") and k.endswith("__"):
            continue
        if isinstance(v, types.FunctionType | staticmethod | classmethod | property | type) or hasattr(type(v), "__get__"):
            continue
        data[k] = v
    return {k: v for k, v in (("data", data), ("defaults", defaults), ("registered", registered)) if v}


def _class_setstate(cls: type, state: dict[str, Any]) -> None:
    _note_state(cls, state, ("data", "defaults"))
    for c in state.get("registered", ()):
        cls.register(c)  # type: ignore[attr-defined]
    for k, v in state.get("data", {}).items():
        setattr(cls, k, v)
    for (k, part), (d, kd) in state.get("defaults", {}).items():
        f = getattr(vars(cls).get(k), part, None) if part else vars(cls).get(k)
        if isinstance(f, types.FunctionType):
            f.__defaults__, f.__kwdefaults__ = d, kd
    if state.get("data"):
        _restore_state()["set"].append((cls, state["data"]))


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


# Names each class statement reads while it runs, by (module, source hash, qualname, line).
_READS: dict[tuple[str, str, str, int], tuple[str, ...]] = {}


def _bindings(cls: type, tm: TransformedModule, first: int) -> dict[str, Any]:
    """The module's globals that running ``cls``'s statement again reads, at their values
    now: what the statement itself reads (bases, decorators, metaclass, the class body), and
    what the program's own functions among them read (a decorator's registry)."""
    from sojourn.capsule.source import global_names, statement_reads
    from sojourn.execution.resumeform import class_code

    key = (tm.name, tm.layout.sha256, cls.__qualname__, first)
    reads = _READS.get(key)
    if reads is None:
        reads = _READS[key] = tuple(statement_reads(class_code(tm, cls.__qualname__, first)))
    ns = tm.namespace
    out: dict[str, Any] = {}
    todo, seen = list(reads), set()
    while todo:
        name = todo.pop(0)
        if name in seen or (name.startswith("__") and name.endswith("__")) or name not in ns:
            continue
        seen.add(name)
        value = ns[name]
        if value is cls:
            continue
        out[name] = value
        if isinstance(value, types.FunctionType) and value.__globals__ is ns:
            todo.extend(sorted(global_names(value.__code__)))
    return out


def _restore_state() -> dict[str, Any]:
    """Per restore: the classes made so far (by capture-time token) and the class attributes
    set so far."""
    from sojourn.capsule.context import current_or_none

    ctx = current_or_none()
    if ctx is None:
        return {"built": {}, "set": []}
    key = id(ctx)
    if key not in _PER_RESTORE:
        weakref.finalize(ctx, _PER_RESTORE.pop, key, None)
        _PER_RESTORE[key] = {"built": {}, "set": []}
    return _PER_RESTORE[key]


_PER_RESTORE: dict[int, dict[str, Any]] = {}


def _copy(value: Any) -> Any:
    return type(value)(value) if type(value) in (list, dict, set) else value


def _make_class(module: str, qualname: str, first: int, bindings: dict[str, Any], token: int) -> type:
    """Run the class statement again, from the module's transformed source (its methods keep
    their pause points), with the names it reads bound to their values at capture.

    What the statement does to objects the capsule already holds is not done again: the
    containers it reads, and the class attributes restored so far (a base class's registry
    that ``__init_subclass__`` fills), are copies while it runs. The module's bindings are
    left as they were. A class whose arguments lead back to itself appears twice in the
    stream; its statement runs once.
    """
    from sojourn.execution.resumeform import class_code

    per = _restore_state()
    if token in per["built"]:
        return per["built"][token]  # type: ignore[no-any-return]
    tm = RUNTIME.module(module)
    remap = _remap(module)
    captured_first = first
    if remap is not None:
        first = remap.class_first(qualname, first)
    ns = tm.namespace
    name = qualname.rpartition(".")[2]
    missing = object()
    saved = {k: ns.get(k, missing) for k in [*bindings, name]}
    shadowed = [(c, k, v) for c, attrs in per["set"] for k, v in attrs.items()]
    for c, k, v in shadowed:
        setattr(c, k, _copy(v))
    ns.update({k: _copy(v) for k, v in bindings.items()})
    try:
        exec(class_code(tm, qualname, first), ns)
        cls = ns[name]
    finally:
        for c, k, v in shadowed:
            setattr(c, k, v)
        for k, v in saved.items():
            if v is missing:
                ns.pop(k, None)
            else:
                ns[k] = v
    per["built"][token] = cls
    if remap is not None:
        _CAPTURED[cls] = (module, qualname, captured_first, bindings, token)
    return cls  # type: ignore[no-any-return]


@register("builtins.type", "abc.ABCMeta", "enum.EnumType", "typing._ProtocolMeta")
def _class_reduce(cls: type, pickler: Any) -> Any:
    tm = RUNTIME.modules.get(cls.__module__)
    if tm is None:
        return code_reducers.reduce_class(cls, pickler)
    data = _as_captured(cls, _class_state(cls), ("data", "defaults"))
    state = (data, None, None, _class_setstate) if data else ()
    if _by_name(cls, tm):
        return (_named, (tm.name, cls.__qualname__), *state)
    owner = _owner(cls, tm)
    if owner is not None:
        return (_member, owner, *state)
    first = _class_line(cls, tm)
    if first is None and "." not in cls.__qualname__:
        # Made by no class statement of the module (collections.namedtuple, type(), enum's
        # functional API): the capsule's class reducer knows those.
        return code_reducers.reduce_class(cls, pickler)
    if "<locals>" in cls.__qualname__.split(".") or "." in cls.__qualname__ or first is None:
        return pickler.problem(cls, f"class {cls.__qualname__} of {tm.filename} is defined inside a function "
                                    "or another class; define it at the top level of its module to carry it")
    tokens = pickler.__dict__.setdefault("_sojourn_program_classes", {})
    token = tokens.setdefault(id(cls), len(tokens))
    pickler.keepalive(cls)
    captured = _CAPTURED.get(cls) if RUNTIME.as_captured else None
    if captured is not None:  # made by this resume from an edited statement: as the capsule has it
        return (_make_class, captured, *state)
    return (_make_class, (tm.name, cls.__qualname__, first, _bindings(cls, tm, first), token), *state)


# Classes made by any other metaclass (torch.autograd.Function's FunctionMeta, a library's
# model metaclass...) come here too: the program's own travel by name or from its transform,
# the others as before (the capsule's class reducer).
register("builtins.type", subclasses=True)(_class_reduce)


# -- generators -------------------------------------------------------------------------------------


def _make_generator(rec: FrameRecord, *loaded: TransformedModule) -> types.GeneratorType:
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
        from sojourn.execution.libiters import reduce_generator

        rebuilt = reduce_generator(g)
        if rebuilt is not None:
            return rebuilt
        what = "a generator expression" if g.gi_code.co_name == "<genexpr>" else f"generator {g.gi_code.co_qualname}"
        return pickler.problem(g, _not_the_programs(g, what))
    tm, scope = info
    cell = (tm,) if notebook_cells.is_cell(tm) else ()
    rec = _untouched(g)
    if rec is not None:
        return (_make_generator, (_listed(rec if RUNTIME.as_captured else RUNTIME.current_record(rec)), *cell))
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
    return (_make_generator, (_listed(rec), *cell))


def _not_the_programs(g: types.GeneratorType, what: str) -> str:
    """Why a generator that no transformed source made cannot travel, and what to do, in the
    words of where it runs (a notebook's cells, or a script)."""
    if notebook_cells.IN_NOTEBOOK and RUNTIME.main is None:
        if what.startswith("a generator expression"):
            return (f"{what} cannot be resumed: write it as a generator function (def ... yield) at the "
                    "top level of a cell, or make it a list, before the checkpoint")
        return (f"{what} cannot be resumed: only generator functions defined with a plain def at the top "
                "level of a cell (not decorated, not methods) resume from their source; define it so and "
                "create the generator again, or finish it before the checkpoint")
    return (f"{what} is not a generator function of the program, so it cannot be "
            "resumed; use a list, or a generator function defined in the program")


@register("sojourn.execution.runtime.TransformedModule")
def _module_reduce(tm: TransformedModule, pickler: Any) -> Any:
    # Only a notebook cell's module travels (as its source, once per capsule: the memo);
    # the program's modules are compiled again from their files on resume.
    if notebook_cells.is_cell(tm) and tm.namespace is pickler.ctx.namespace:
        return (notebook_cells.load_cell, (tm.name, tm.filename, tm.source))
    return pickler.problem(tm, f"the code of {tm.filename} travels only with the namespace it runs in")


def _async_refused(obj: Any, pickler: Any) -> Any:
    code = getattr(obj, "cr_code", None) or getattr(obj, "ag_code", None)
    name = code.co_qualname if code is not None else type(obj).__name__
    when = "the checkpoint" if notebook_cells.IN_NOTEBOOK and RUNTIME.main is None else "the pause"
    return pickler.problem(obj, f"{name} is a coroutine (async def); sojourn cannot pause or carry "
                                f"coroutines: finish or cancel it before {when}")


register("builtins.coroutine", "builtins.async_generator")(_async_refused)
