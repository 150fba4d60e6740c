"""Where a paused program stands: the stack of user frames, each as a statement id and locals.

The innermost frame is paused *before* a statement (``mode="stmt"``). Every frame above it is
waiting for a callee at a statement-level call (``"call"``), at a ``for`` fetching its next
item (``"foriter"``), or, for generators, at a statement-level ``yield`` (``"yield"``) or
``yield from`` (``"yieldfrom"``). Which statement a caller waits in comes from its
``f_lasti`` mapped through ``co_positions()`` to the source span of the pending call, and the
callee is checked (its code must be what the call expression names); anything else on the
stack (library code, a comprehension, a C callback, an expression that is not a statement)
defers the pause to a later statement.

Nothing here is version specific in what it *saves*: bytecode offsets are only read, in this
process, to find source spans.
"""

from __future__ import annotations

import inspect
import types
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sojourn.errors import Problem, SojournError

if TYPE_CHECKING:
    from sojourn.execution.runtime import Runtime, TransformedModule

CO_GENERATOR = inspect.CO_GENERATOR
CO_COROUTINE = inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR | inspect.CO_ITERABLE_COROUTINE


class Deferred(Exception):
    """The program is not at a resumable point now; the next statement boundary may be.

    ``barrier``, when known, says until when no attempt can land, so none is made
    (``PauseController``): while the frame ``barrier`` is on the stack (library code, a
    comprehension), or, with ``lasti``, while the program's frame ``barrier`` still waits in
    the call at that instruction (its callee was called by a C function in between, or from
    inside an expression)."""

    def __init__(self, message: str, barrier: types.FrameType | None = None, lasti: int | None = None):
        super().__init__(message)
        self.barrier = barrier
        self.lasti = lasti


class Refused(SojournError):
    """The program holds something that cannot be carried across a pause."""

    def __init__(self, message: str, problems: list[Problem]):
        super().__init__(message)
        self.problems = problems


@dataclass
class FrameRecord:
    """One paused frame. Pickled with the capsule (one memo with the program's objects)."""

    module: str
    scope: str  # Scope.key
    sid: int
    mode: str  # "stmt", "call", "foriter", "yield", "yieldfrom", "start"
    locals: dict[str, Any] | None  # None for a module frame (its globals travel)
    cells: dict[str, Any] = field(default_factory=dict)  # free and cell variables, as cells
    via: str = ""  # how a waiting frame continues: "reenter", "gen" or "next"
    callee: FrameRecord | None = None  # the frame this one waits for (via reenter/next)
    gen: Any = None  # the generator this one drives (via gen)
    call: str = "call"  # how this frame was called: "call" or "init"
    result: Any = None  # for "init": the instance the call returns
    where: str = ""


@dataclass
class Position:
    main: FrameRecord
    records: list[FrameRecord]  # outermost first, generators included
    running: dict[int, FrameRecord]  # id(frame of a running generator) -> its record
    frames: list[types.FrameType]

    def describe(self) -> str:
        return " -> ".join(r.where for r in self.records)


_POSITIONS: dict[types.CodeType, list[Any]] = {}


def positions(code: types.CodeType) -> list[Any]:
    try:
        return _POSITIONS[code]
    except KeyError:
        out = _POSITIONS[code] = list(code.co_positions())
        return out


def span_at(frame: types.FrameType) -> tuple[int, int, int, int] | None:
    pos = positions(frame.f_code)
    i = frame.f_lasti // 2
    if not 0 <= i < len(pos) or pos[i][0] is None:
        return None
    return tuple(pos[i])  # type: ignore[return-value]


def describe_frame(f: types.FrameType) -> str:
    code = f.f_code
    return f"{code.co_qualname} ({code.co_filename}:{f.f_lineno})"


def _why_not_user(f: types.FrameType) -> str:
    code = f.f_code
    if code.co_flags & CO_COROUTINE:
        return (f"the program is inside a coroutine ({describe_frame(f)}); pauses inside async code "
                "are not supported, so the pause waits until it returns")
    what = {"<listcomp>": "a comprehension", "<dictcomp>": "a comprehension", "<setcomp>": "a comprehension",
            "<genexpr>": "a generator expression", "<lambda>": "a lambda"}.get(code.co_name)
    if what is not None:
        return f"{what} is running ({describe_frame(f)}); the pause waits until its statement is done"
    return f"library code is running ({describe_frame(f)}); the pause waits until it returns to the program"


# -- resolving what a call statement calls, without side effects -------------------------------


_MISSING = object()


def resolve(chain: tuple[tuple[str, str], ...] | None, f: types.FrameType) -> Any:
    if not chain:
        return _MISSING
    name = chain[0][1]
    obj: Any = _MISSING
    for d in (f.f_locals, f.f_globals, f.f_builtins):
        if name in d:
            obj = d[name]
            break
    for _, attr in chain[1:]:
        if obj is _MISSING:
            return _MISSING
        try:
            obj = inspect.getattr_static(obj, attr)
        except AttributeError:
            return _MISSING
        if isinstance(obj, staticmethod | classmethod):
            obj = obj.__func__
        elif isinstance(obj, property | types.GetSetDescriptorType | types.MemberDescriptorType):
            return _MISSING  # running a getter to find out is a side effect
    return obj


def function_for(target: Any, code: types.CodeType) -> tuple[types.FunctionType, str] | None:
    """The Python function that calling ``target`` runs with ``code``, and how (call/init)."""
    if isinstance(target, staticmethod | classmethod | types.MethodType):
        target = target.__func__
    if isinstance(target, types.FunctionType):
        return (target, "call") if target.__code__ is code else None
    if isinstance(target, type):
        init = inspect.getattr_static(target, "__init__", None)
        if isinstance(init, types.FunctionType) and init.__code__ is code:
            return init, "init"
        return None
    call = inspect.getattr_static(type(target), "__call__", None)
    if isinstance(call, types.FunctionType) and call.__code__ is code:
        return call, "call"
    return None


# -- frames -> records ------------------------------------------------------------------------------


def frame_locals(f: types.FrameType, fn: types.FunctionType | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(locals, cells) of a function frame. Free and cell variables also travel as cells, so
    that closures created by the frame keep sharing them with the resumed frame."""
    code = f.f_code
    loc = dict(f.f_locals)
    free, cellv = code.co_freevars, code.co_cellvars
    cells: dict[str, Any] = {}
    if fn is not None and fn.__closure__:
        cells.update(zip(fn.__code__.co_freevars, fn.__closure__, strict=False))
    for name in cellv:
        if name not in cells:
            cells[name] = _shared_cell(code, name, loc) or _new_cell(loc, name)
    for name in free:
        if name not in cells:
            cells[name] = _new_cell(loc, name)
    # Every value is kept in `locals`, cells or not: whether a variable is a cell depends on
    # the Python version (3.11 makes a variable read by a comprehension a cell, 3.12 inlines
    # comprehensions), so the resumed side decides from its own compile which are cells.
    out = {k: v for k, v in loc.items() if not k.startswith("__sojourn")}
    return out, cells


def _new_cell(loc: dict[str, Any], name: str) -> Any:
    return types.CellType(loc[name]) if name in loc else types.CellType()


def _shared_cell(code: types.CodeType, name: str, loc: dict[str, Any]) -> Any:
    """The cell a frame's closures share for ``name``, found on a closure it made.

    A running frame does not expose its cells; a function defined by this frame and still
    referenced from its locals does. Without one, a new cell is made (nothing shares it).
    """
    children = {c for c in code.co_consts if isinstance(c, types.CodeType)}
    candidates: list[Any] = []
    for v in loc.values():
        candidates.append(v)
        if isinstance(v, list | tuple):
            candidates.extend(v[:64])
        elif isinstance(v, dict):
            candidates.extend(list(v.values())[:64])
    want = loc.get(name, _MISSING)
    for v in candidates:
        fn = getattr(v, "__func__", v)
        if isinstance(fn, types.FunctionType) and fn.__code__ in children and fn.__closure__:
            names = fn.__code__.co_freevars
            if name in names:
                cell = fn.__closure__[names.index(name)]
                try:
                    same = cell.cell_contents is want
                except ValueError:
                    same = want is _MISSING
                if same:
                    return cell
    return None


def with_problems(tm: TransformedModule, sid: int, scope_locals: dict[str, Any]) -> list[tuple[Any, str]]:
    """Context managers of the ``with`` blocks around ``sid`` that cannot be re-entered."""
    from sojourn.execution.contexts import reentry_problem

    out = []
    for a in tm.layout.ancestors(sid):
        cmvar = tm.layout.with_cms.get(a)
        if cmvar is None or cmvar not in scope_locals:
            continue
        cm = scope_locals[cmvar]
        reason = reentry_problem(cm)
        if reason is not None:
            out.append((cm, f"{reason} (block at {tm.layout.where(a)})"))
    return out


@dataclass
class _UserFrame:
    frame: types.FrameType
    tm: TransformedModule
    scope: str
    reentered: types.FrameType | None  # the runtime's re-entry frame just below, if any


def capture(rt: Runtime, frame: types.FrameType, sid: int) -> Position:
    """The position of the program whose innermost user frame ``frame`` is before ``sid``."""
    stack: list[types.FrameType] = []
    f: types.FrameType | None = frame
    while f is not None:
        stack.append(f)
        if f.f_code in rt.main_codes:
            break
        f = f.f_back
    else:
        raise Deferred("the main script is not running (a module is being imported)")
    stack.reverse()
    user: list[_UserFrame] = []
    pending: types.FrameType | None = None
    for f in stack:
        if f.f_code in rt.transparent_codes:
            pending = f
            continue
        info = rt.scope_of(f.f_code)
        if info is None:
            raise Deferred(_why_not_user(f), f)
        user.append(_UserFrame(f, info[0], info[1], pending))
        pending = None
    if pending is not None:
        raise Deferred("the program is being resumed")

    records: list[FrameRecord] = []
    running: dict[int, FrameRecord] = {}
    fn: types.FunctionType | None = None
    call = "call"
    prev: FrameRecord | None = None
    for i, u in enumerate(user):
        f = u.frame
        layout = u.tm.layout
        loc: dict[str, Any] | None
        cells: dict[str, Any] = {}
        if f.f_code in rt.main_codes:
            loc = None
        else:
            loc, cells = frame_locals(f, fn)
        rec = FrameRecord(u.tm.name, u.scope, -1, "", loc, cells, call=call)
        if call == "init" and loc is not None:
            rec.result = loc.get(f.f_code.co_varnames[0])
        if i == len(user) - 1:
            rec.sid, rec.mode = sid, "stmt"
        else:
            fn, call = _waiting(rec, u, user[i + 1], layout)
        rec.where = layout.where(rec.sid)
        if f.f_code.co_flags & CO_GENERATOR:
            running[id(f)] = rec
        elif prev is not None and prev.via in ("reenter", "next"):
            prev.callee = rec
        records.append(rec)
        prev = rec
    problems = []
    for u, rec in zip(user, records, strict=True):
        scope_locals = u.frame.f_globals if rec.locals is None else rec.locals
        for cm, reason in with_problems(u.tm, rec.sid, scope_locals):
            t = type(cm)
            problems.append(Problem(rec.where, f"{t.__module__}.{t.__qualname__}", reason))
    if problems:
        raise Refused("an open `with` block cannot be carried across the pause", problems)
    return Position(records[0], records, running, [u.frame for u in user])


def _waiting(rec: FrameRecord, u: _UserFrame, nxt: _UserFrame, layout: Any) -> tuple[types.FunctionType | None, str]:
    """Fill in where ``u`` waits for ``nxt``; returns the callee's function and call kind."""
    f, callee = u.frame, nxt.frame
    pos = span_at(f)
    key = (u.scope, pos)
    site = layout.sites.get(key) if pos is not None else None
    here = f"{f.f_code.co_filename}:{f.f_lineno}"
    if site is None or key in layout.ambiguous:
        raise Deferred(f"{here}: {callee.f_code.co_qualname} was called from inside an expression "
                       "(a condition, a comprehension, a default argument...); the pause waits until it returns", f, f.f_lasti)
    rec.sid = site.sid
    is_gen = bool(callee.f_code.co_flags & CO_GENERATOR)
    if site.kind == "call":
        rec.mode = "call"
        if nxt.reentered is not None:  # a frame re-entered after a resume: the runtime called it
            re = nxt.reentered.f_locals
            rec.via = "reenter"
            return re.get("fn"), re["rec"].call
        if is_gen:
            gen = _driven_generator(site, f, callee)
            if gen is None:
                raise Deferred(f"{here}: generator {callee.f_code.co_qualname} is driven by something "
                               "other than next(), send() or a for loop", f, f.f_lasti)
            rec.via, rec.gen = "gen", gen
            return None, "call"
        target = resolve(site.func, f)
        found = function_for(target, callee.f_code)
        if found is None:
            raise Deferred(f"{here}: {callee.f_code.co_qualname} was not called directly by the statement "
                           "(library code or a C function in between)", f, f.f_lasti)
        rec.via = "reenter"
        return found
    if site.kind == "foriter":
        rec.mode = "foriter"
        it = f.f_locals.get(site.itvar or "")
        if is_gen and getattr(it, "gi_frame", None) is callee:
            rec.via, rec.gen = "gen", it
            return None, "call"
        nxt_fn = inspect.getattr_static(type(it), "__next__", None)
        if nxt.reentered is not None and not is_gen:
            rec.via = "next"
            return nxt.reentered.f_locals.get("fn"), "call"
        if isinstance(nxt_fn, types.FunctionType) and nxt_fn.__code__ is callee.f_code:
            rec.via = "next"
            return nxt_fn, "call"
        raise Deferred(f"{here}: the for loop's iterator runs library code", f, f.f_lasti)
    if site.kind == "yieldfrom":
        it = f.f_locals.get(site.itvar or "")
        if is_gen and getattr(it, "gi_frame", None) is callee:
            rec.mode, rec.via, rec.gen = "call", "gen", it
            return None, "call"
        raise Deferred(f"{here}: yield from delegates to an iterator that runs library code", f, f.f_lasti)
    raise Deferred(f"{here}: not a resumable point")


def _driven_generator(site: Any, f: types.FrameType, callee: types.FrameType) -> Any:
    chain: tuple[tuple[str, str], ...] = site.func or ()
    if resolve(chain, f) is next:
        arg = resolve(site.arg0, f)
        return arg if getattr(arg, "gi_frame", None) is callee else None
    if len(chain) > 1 and chain[-1][1] in ("send", "__next__", "throw"):
        owner = resolve(tuple(chain[:-1]), f)
        if isinstance(owner, types.GeneratorType) and owner.gi_frame is callee:
            return owner
    return None
