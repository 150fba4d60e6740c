"""Resume forms: code that carries a saved frame on from its statement.

Python has no ``goto``, so a saved frame is continued by a *copy* of its body cut at the saved
statement, made in the new process for the saved statements only (normal code has no resume
paths). For a path through compound statements the copy re-enters each of them:

* ``if``/``match``: the branch or case that was taken, from the saved statement on;
* ``for``: ``for v in chain((SENT,), it)``: the first pass finishes the interrupted iteration,
  the following passes are ordinary ones over the same iterator; ``break``, ``continue`` and
  ``else`` keep their meaning;
* ``while``: a first pass that skips the test, then the ordinary loop;
* ``with``: entered through :class:`~sojourn.execution.contexts.WithReentry` (the header does
  not run again; the saved manager is exited when the block ends);
* ``try``: handlers, ``else`` and ``finally`` kept; a paused handler gets its exception raised
  again into ``except BaseException as name`` so that a bare ``raise`` still works.

The saved statement itself starts the copy: as is (``stmt``); with its pending call replaced by
``__sojourn_reenter__(__sojourn_rec__.callee)``, which carries the callee's saved frame on and
returns what the call would have (``call``); or with its ``yield`` yielding the rebuild marker
(``yield``). A function's copy is compiled as a *variant*: a function of one argument (the
frame record) whose prologue restores the locals. Variants are compiled inside a class of the
same name when the original was, so private names are mangled the same way, and their cells
are the saved ones, so closures made before the pause still share variables with it.
"""

from __future__ import annotations

import ast
import copy
import types
from typing import TYPE_CHECKING, Any

from sojourn.execution import transform as T
from sojourn.execution.checks import instrument
from sojourn.execution.expressions import inline_point
from sojourn.execution.runtime import BOOT, walk_code

if TYPE_CHECKING:
    from sojourn.execution.position import FrameRecord
    from sojourn.execution.runtime import Runtime, TransformedModule

_RUNNING_MODES = ("stmt", "call", "foriter")


def _n(name: str, at: ast.AST, ctx: type[ast.expr_context] = ast.Load) -> ast.Name:
    return ast.copy_location(ast.Name(id=name, ctx=ctx()), at)


def _loc(node: Any, at: ast.AST) -> Any:
    return T.located(ast.copy_location(node, at), at)


def _copy(stmts: list[ast.stmt]) -> list[ast.stmt]:
    return [copy.deepcopy(s) for s in stmts]


class _Cutter:
    def __init__(self, layout: T.Layout, rec: FrameRecord):
        self.layout = layout
        self.rec = rec

    def block(self, stmts: list[ast.stmt], path: T.Path) -> list[ast.stmt]:
        i = path[0][1]
        S = stmts[i]
        rest = _copy(stmts[i + 1 :])
        if len(path) == 1:
            return self.head(S) + rest
        return self.enter(S, path[1:]) + rest

    def enter(self, S: ast.stmt, path: T.Path) -> list[ast.stmt]:
        field, j = path[0]
        sid: int = S._sj_sid  # type: ignore[attr-defined]
        if isinstance(S, ast.If):
            return self.block(getattr(S, field), path)
        if isinstance(S, ast.Match):
            return self.block(S.cases[j].body, path[1:])
        if isinstance(S, ast.For):
            if field == "orelse":
                return self.block(S.orelse, path)
            v = f"{T.TEMP}v{sid}"
            normal = [_loc(ast.Assign(targets=[copy.deepcopy(S.target)], value=_n(v, S)), S), *_copy(S.body)]
            first = ast.Compare(left=_n(v, S), ops=[ast.Is()], comparators=[_n(T.SENT, S)])
            branch = ast.If(test=first, body=self.block(S.body, path), orelse=normal)
            loop = ast.For(target=_n(v, S, ast.Store), iter=self._chain(_n(T.SENT, S), S),
                           body=[_loc(branch, S)], orelse=_copy(S.orelse), type_comment=None)
            loop._sj_sid = sid  # type: ignore[attr-defined]  # its __next__ keeps the out-of-memory guard
            return [_loc(loop, S)]
        if isinstance(S, ast.While):
            if field == "orelse":
                return self.block(S.orelse, path)
            w = f"{T.TEMP}w{sid}"
            set_w = lambda value: _loc(ast.Assign(targets=[_n(w, S, ast.Store)], value=ast.Constant(value)), S)  # noqa: E731
            test = ast.BoolOp(op=ast.Or(), values=[_n(w, S), copy.deepcopy(S.test)])
            body = [_loc(ast.If(test=_n(w, S), body=[set_w(False), *self.block(S.body, path)], orelse=_copy(S.body)), S)]
            return [set_w(True), _loc(ast.While(test=test, body=body, orelse=_copy(S.orelse)), S)]
        if isinstance(S, ast.With):
            cm = self.layout.with_cms[sid]
            item = ast.withitem(context_expr=_loc(ast.Call(func=_n(T.WITH, S), args=[_n(cm, S)], keywords=[]), S))
            return [_loc(ast.With(items=[item], body=self.block(S.body, path), type_comment=None), S)]
        if isinstance(S, ast.Try | ast.TryStar):
            fin = _copy(S.finalbody)
            kind = type(S)
            if field == "body":
                t = kind(body=self.block(S.body, path), handlers=copy.deepcopy(S.handlers), orelse=_copy(S.orelse), finalbody=fin)
                return [_loc(t, S)]
            if field == "orelse":
                inner = self.block(S.orelse, path)
                return [_loc(ast.Try(body=inner, handlers=[], orelse=[], finalbody=fin), S)] if fin else inner
            H = S.handlers[j]
            assert H.name is not None
            again = _loc(ast.Raise(exc=_n(H.name, S), cause=None), S)
            h = ast.ExceptHandler(type=_n("BaseException", S), name=H.name, body=self.block(H.body, path[1:]))
            return [_loc(ast.Try(body=[again], handlers=[_loc(h, S)], orelse=[], finalbody=fin), S)]
        raise RuntimeError(f"cannot re-enter a {type(S).__name__} statement")

    def _chain(self, first: ast.expr, S: ast.For) -> ast.Call:
        call = ast.Call(func=_n(T.CHAIN, S), args=[ast.Tuple(elts=[first], ctx=ast.Load()), copy.deepcopy(S.iter)], keywords=[])
        # On 3.13 FOR_ITER carries the span of the iterator expression: keep the loop's own.
        return T.located(ast.copy_location(call, S.iter), S.iter)  # type: ignore[no-any-return]

    def head(self, S: ast.stmt) -> list[ast.stmt]:
        rec = self.rec
        S2 = copy.deepcopy(S)
        S2._sj_nocheck = True  # type: ignore[attr-defined]
        if rec.mode == "call" and rec.via == "reenter":
            target = inline_point(S2)
            if not isinstance(target, ast.Call):
                raise RuntimeError("the saved statement has no call to re-enter")
            callee = ast.Attribute(value=_n(T.REC, target), attr="callee", ctx=ast.Load())
            new = T.located(ast.copy_location(ast.Call(func=_n(T.REENTER, target), args=[callee], keywords=[]), target), target)
            return [_Replace(target, new).visit(S2)]
        if rec.mode == "foriter" and rec.via == "next":
            assert isinstance(S, ast.For)
            v = f"{T.TEMP}v{S._sj_sid}"  # type: ignore[attr-defined]
            callee = ast.Attribute(value=_n(T.REC, S), attr="callee", ctx=ast.Load())
            get = ast.Call(func=_n(T.REENTER, S), args=[callee, ast.Constant(True)], keywords=[])
            first = _loc(ast.Assign(targets=[_n(v, S, ast.Store)], value=get), S)
            loop = ast.For(target=copy.deepcopy(S.target), iter=self._chain(_n(v, S), S), body=_copy(S.body),
                           orelse=_copy(S.orelse), type_comment=None)
            loop._sj_sid = S._sj_sid  # type: ignore[attr-defined]
            done = ast.Compare(left=_n(v, S), ops=[ast.Is()], comparators=[_n(T.SENT, S)])
            return [first, _loc(ast.If(test=done, body=_copy(S.orelse) or [ast.Pass()], orelse=[_loc(loop, S)]), S)]
        if rec.mode == "yield":
            point = inline_point(S2)
            assert isinstance(point, ast.Yield)
            point.value = _n(T.BOOT, point)
            return [S2]
        if rec.mode == "yieldfrom" and rec.via != "gen":
            # The delegate is a plain iterator: wait for the consumer's next request first.
            boot = _loc(ast.Expr(value=ast.Yield(value=_n(T.BOOT, S))), S)
            return [boot, S2]
        return [S2]


class _Replace(ast.NodeTransformer):
    def __init__(self, old: ast.AST, new: ast.AST):
        self.old, self.new = old, new

    def visit(self, node: ast.AST) -> Any:
        if node is self.old:
            return self.new
        return self.generic_visit(node)


# -- module and function forms -------------------------------------------------------------------


def _compile(tree: ast.Module, filename: str) -> types.CodeType:
    instrument(tree)
    ast.fix_missing_locations(tree)
    return compile(tree, filename, "exec", dont_inherit=True)


def module_resume_code(tm: TransformedModule, rec: FrameRecord) -> types.CodeType:
    from sojourn.execution.runtime import RUNTIME

    rec = RUNTIME.current_record(rec)
    tree, _ = tm.clean()
    path = tm.layout.stmts[rec.sid].path
    body = _Cutter(tm.layout, rec).block(tree.body, path)
    return _compile(ast.Module(body=body, type_ignores=[]), tm.filename)


def imports_code(tm: TransformedModule, upto: int) -> list[types.CodeType]:
    """The module's top-level imports before statement ``upto``, one code object each (the
    only statements of a resumed main script that run again: definitions come back from the
    capsule)."""
    tree, _ = tm.clean()
    out = []
    for S in tree.body[:upto]:
        if isinstance(S, ast.Import) or (isinstance(S, ast.ImportFrom) and S.module != "__future__"):
            S2: ast.stmt = copy.deepcopy(S)
            S2._sj_nocheck = True  # type: ignore[attr-defined]
            out.append(_compile(ast.Module(body=[S2], type_ignores=[]), tm.filename))
    return out


def class_code(tm: TransformedModule, qualname: str, first: int) -> types.CodeType:
    """The class statement ``qualname`` that starts at line ``first``, alone, in normal form."""
    tree, _ = tm.clean()
    name = qualname.rpartition(".")[2]
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == name and getattr(node, "_sj_class", None) == first:
            return _compile(ast.Module(body=[copy.deepcopy(node)], type_ignores=[]), tm.filename)
    raise RuntimeError(f"class {qualname} (line {first}) is not in {tm.filename}")


def _scope_names(F: ast.FunctionDef) -> tuple[list[str], list[str]]:
    """Names declared ``global`` / ``nonlocal`` in F's own scope."""
    glob: list[str] = []
    nonl: list[str] = []
    stack: list[ast.AST] = list(F.body)
    while stack:
        n = stack.pop()
        if isinstance(n, ast.Global):
            glob.extend(n.names)
        elif isinstance(n, ast.Nonlocal):
            nonl.extend(n.names)
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            continue
        stack.extend(ast.iter_child_nodes(n))
    return sorted(set(glob)), sorted(set(nonl))


def _variant_tree(tm: TransformedModule, rec: FrameRecord, F: ast.FunctionDef, original: types.CodeType) -> ast.Module:
    scope = tm.layout.scopes[rec.scope]
    is_gen = scope.kind == "generator"
    # The original's first parameter stays the first parameter: zero-argument super() reads it.
    first = original.co_varnames[0] if original.co_argcount else None
    outer_names = sorted({*original.co_cellvars, *original.co_freevars} - {"__class__", first})
    glob, _ = _scope_names(F)
    decls: list[ast.stmt] = []
    if outer_names:
        decls.append(ast.Nonlocal(names=outer_names))
    glob = [g for g in glob if g not in outer_names]
    if glob:
        decls.append(ast.Global(names=glob))
    body: list[ast.stmt] = []
    L = "__sojourn_locals__"
    body.append(ast.Assign(targets=[ast.Name(id=L, ctx=ast.Store())],
                           value=ast.Attribute(value=ast.Name(id=T.REC, ctx=ast.Load()), attr="locals", ctx=ast.Load())))
    for name in sorted(rec.locals or {}):
        if name.isidentifier() and name not in outer_names and name not in glob and name not in ("__class__", first):
            fetch = ast.Subscript(value=ast.Name(id=L, ctx=ast.Load()), slice=ast.Constant(name), ctx=ast.Load())
            test = ast.Compare(left=ast.Constant(name), ops=[ast.In()], comparators=[ast.Name(id=L, ctx=ast.Load())])
            body.append(ast.If(test=test, body=[ast.Assign(targets=[ast.Name(id=name, ctx=ast.Store())], value=fetch)], orelse=[]))
    body.append(ast.Delete(targets=[ast.Name(id=L, ctx=ast.Del())]))
    if is_gen and rec.mode in _RUNNING_MODES:
        body.append(ast.Expr(value=ast.Yield(value=ast.Name(id=T.BOOT, ctx=ast.Load()))))
    if rec.mode == "start":
        body.extend(_copy(F.body))
    else:
        body.extend(_Cutter(tm.layout, rec).block(F.body, tm.layout.stmts[rec.sid].path))
    # Names local to the original stay local here (a dead assignment decides the symbol table).
    local = [n for n in original.co_varnames if n not in outer_names and n not in glob]
    if local:
        dead = ast.Assign(targets=[ast.Name(id=n, ctx=ast.Store()) for n in local], value=ast.Constant(None))
        body.append(ast.If(test=ast.Constant(False), body=[dead], orelse=[]))
    body = decls + [_DropDeclarations().visit(node) for node in body]
    for node in body:
        T.located(node, F)
    V = copy.copy(F)  # keeps every field this Python's FunctionDef has (type_params on 3.12+)
    V.name = F.name
    params = [ast.arg(arg=first)] if first else []
    V.args = ast.arguments(posonlyargs=[], args=[*params, ast.arg(arg=T.REC)], vararg=None, kwonlyargs=[],
                           kw_defaults=[], kwarg=None, defaults=[])
    V.body = body
    V.decorator_list = []
    V.returns = None
    T.located(V.args, F)
    # The function whose parameters are the free variables goes *inside* the class that gives
    # private names their mangling: a class statement inside a function would bind the class
    # name in that function, and a method naming its own class would read that binding.
    # Defined inside that function, the variant's own name would be a variable of it, which
    # a call of the function by its (global) name from the variant would find unbound.
    own = [] if F.name in outer_names else [ast.Global(names=[F.name])]
    outer = ast.FunctionDef(name="__sojourn_outer__", args=ast.arguments(
        posonlyargs=[], args=[ast.arg(arg=n) for n in outer_names], vararg=None, kwonlyargs=[],
        kw_defaults=[], kwarg=None, defaults=[]), body=[*own, V, ast.Return(value=None)], decorator_list=[],
        returns=None)
    if hasattr(F, "type_params"):
        outer.type_params = []  # type: ignore[attr-defined]
    T.located(outer, F)
    top: ast.stmt = outer
    if scope.mangle:
        top = ast.ClassDef(name=scope.mangle, bases=[], keywords=[], body=[outer], decorator_list=[])
        if hasattr(F, "type_params"):
            top.type_params = []  # type: ignore[attr-defined]
        T.located(top, F)
    return ast.Module(body=[top], type_ignores=[])


class _DropDeclarations(ast.NodeTransformer):
    """global/nonlocal are declared once at the top of a variant; copies of them further down
    would come after a use of the name, which Python refuses."""

    def visit_Global(self, node: ast.Global) -> ast.AST:
        return ast.copy_location(ast.Pass(), node)

    visit_Nonlocal = visit_Global  # type: ignore[assignment]

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        return node  # a nested scope keeps its own declarations

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]
    visit_ClassDef = visit_FunctionDef  # type: ignore[assignment]
    visit_Lambda = visit_FunctionDef  # type: ignore[assignment]


def _requalify(code: types.CodeType, old: str, new: str) -> types.CodeType:
    consts = tuple(_requalify(c, old, new) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    q = code.co_qualname
    if q == old or q.startswith(old + "."):
        q = new + q[len(old):]
    return code.replace(co_qualname=q, co_consts=consts)


def variant_code(rt: Runtime, rec: FrameRecord) -> types.CodeType:
    rec = rt.current_record(rec)
    key = (rec.module, rec.scope, rec.sid, rec.mode, rec.via, tuple(sorted(rec.locals or ())))
    code = rt.variants.get(key)
    if code is not None:
        return code
    tm = rt.module(rec.module)
    _, defs = tm.clean()
    F = defs[rec.scope]
    original = tm.scope_code[rec.scope]
    scope = tm.layout.scopes[rec.scope]
    module_code = _compile(_variant_tree(tm, rec, F, original), tm.filename)
    found = None
    for c in walk_code(module_code):
        if c.co_name == F.name and T.REC in c.co_varnames[: c.co_argcount] and c.co_argcount <= 2:
            found = c
            break
    if found is None:
        raise RuntimeError(f"the resume form of {scope.qualname} did not compile as expected")
    prefix = (f"{scope.mangle}." if scope.mangle else "") + "__sojourn_outer__.<locals>." + F.name
    code = _requalify(found, prefix, scope.qualname)
    rt.register_code(tm, code, variant_of=rec.scope)
    rt.variants[key] = code
    return code


def variant_function(rt: Runtime, rec: FrameRecord) -> types.FunctionType:
    code = variant_code(rt, rec)
    tm = rt.modules[rec.module]
    cells = rec.cells or {}
    values = rec.locals or {}
    closure = tuple(
        cells[n] if n in cells else types.CellType(values[n]) if n in values else types.CellType()
        for n in code.co_freevars
    )
    return types.FunctionType(code, tm.namespace, code.co_name, None, closure or None)


def variant_args(fn: types.FunctionType, rec: FrameRecord) -> tuple[Any, ...]:
    """What a variant is called with: its record, after the original first argument if it
    takes one."""
    code = fn.__code__
    if code.co_argcount == 2:
        return ((rec.locals or {}).get(code.co_varnames[0]), rec)
    return (rec,)


__all__ = ["BOOT", "imports_code", "module_resume_code", "variant_args", "variant_function"]
