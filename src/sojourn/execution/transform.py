"""The normal form every user module runs in, statement ids, and where pauses may land.

A paused frame must hold everything it needs in *locals*, because what CPython keeps on its
value stack cannot be read or rebuilt portably. So user code is rewritten (by AST, from the
source) into a normal form that computes the same thing:

* ``for T in E`` keeps its iterator in a local: ``_sj_itN = __sojourn_iter__(E)``;
  re-entering ``for T in _sj_itN`` after a resume continues with the same iterator;
* calls (and ``yield``) nested in a statement are hoisted into temporaries, in evaluation
  order, so that every call that may be paused in is a statement of its own: a pause inside
  ``g`` in ``x = f() + g()`` does not run ``f`` again. Operands evaluated before a hoisted
  call are hoisted too unless they are names, constants or a method lookup, so the order of
  side effects is kept. Temporaries are deleted right after the statement that uses them;
* ``with A as a, B as b`` is nested, and each context manager is kept in a local
  ``_sj_cmN`` so that a resumed block can exit it without running ``A`` again;
* unnamed ``except`` clauses get a name, so a paused handler's exception is in locals.

Every statement of the normal form gets a statement id (``sid``): its index in a
deterministic walk of the normalized tree. Ids come from the source, never from bytecode, so
a position saved under one Python version means the same statement under another; a digest of
the layout is kept with each capsule to refuse a resume if the trees ever differ. The ids,
scopes and wait sites are recorded in a :class:`~sojourn.execution.layout.Layout`.

Pause checks (``if __sojourn_flag__ is not None: __sojourn_pause__(sid)``) read a module
global, the cheapest flag CPython offers (``is not None`` compiles to one conditional jump on
every version, where a truth test costs 3.13 an extra ``TO_BOOL``), and are placed where a
running program must pass soon: at the head of every loop body, at the entry of every function
that calls something (recursion), and before each module-level statement outside loops. Leaf
functions and straight code inside functions carry none, which keeps a tight loop within a
few per cent of plain Python.

Out-of-memory guards: every simple statement with an id (an expression, an assignment, a
``return``) and every ``for`` (whose ``__next__`` may run out of memory) is wrapped as
``try: S`` / ``except __sojourn_oomtypes__: __sojourn_oom__(sid); raise``. A ``try`` costs
nothing until something is raised (exception tables); the handler decides whether the error
is an out-of-memory one the program can be paused at (see :mod:`oom`), and otherwise
re-raises it unchanged. Both are inserted by :mod:`checks` after normalisation, so they take no
statement id.
"""

from __future__ import annotations

import ast
import copy
import hashlib
from typing import Any

from sojourn.execution.expressions import (
    ITER_WRAPPERS,
    bound_names,
    children,
    get,
    hoistable,
    inline_point,
    may_catch_oom,
    pure,
    put,
    static_callee,
    suspends,
)
from sojourn.execution.layout import Layout, Path, Scope, Site, Span, Stmt

TRANSFORM_VERSION = 2

# Names the runtime puts into every transformed module's globals. They end with "__" so that
# private-name mangling in class bodies leaves them alone, and the capsule skips "__sojourn*".
FLAG = "__sojourn_flag__"
PAUSE = "__sojourn_pause__"
ITER = "__sojourn_iter__"
REENTER = "__sojourn_reenter__"
BOOT = "__sojourn_boot__"
SENT = "__sojourn_sent__"
CHAIN = "__sojourn_chain__"
WITH = "__sojourn_with__"
REC = "__sojourn_rec__"
OOM = "__sojourn_oom__"
OOMTYPES = "__sojourn_oomtypes__"
# Temporaries live in frames and must travel, so they are ordinary names (one underscore: no
# mangling in methods).
TEMP = "_sj_"


class TransformError(SyntaxError):
    """The source cannot be put in normal form (it is not valid Python for this version)."""


def source_hash(source: str) -> str:
    return hashlib.sha256(source.encode("utf-8")).hexdigest()


def span(node: ast.AST) -> Span:
    return (node.lineno, node.end_lineno or node.lineno, node.col_offset, node.end_col_offset or 0)  # type: ignore[attr-defined]


def _name(id_: str, ctx: type[ast.expr_context], at: ast.AST) -> ast.Name:
    return ast.copy_location(ast.Name(id=id_, ctx=ctx()), at)


def located(node: ast.AST, at: ast.AST) -> Any:
    for n in ast.walk(node):
        if isinstance(n, ast.expr | ast.stmt | ast.excepthandler | ast.arg | ast.keyword) and not hasattr(n, "lineno"):
            ast.copy_location(n, at)
    return node


def _set_span(node: ast.AST, line: int, col: int, width: int) -> None:
    node.lineno, node.end_lineno = line, line  # type: ignore[attr-defined]
    node.col_offset, node.end_col_offset = col, col + width  # type: ignore[attr-defined]


def is_docstring(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


# -- the normaliser ------------------------------------------------------------------------------


class _ScopeState:
    def __init__(self, scope: Scope, is_class: bool = False):
        self.scope = scope
        self.is_class = is_class
        self.ntemp = 0

    def temp(self, kind: str = "t") -> str:
        self.ntemp += 1
        return f"{TEMP}{kind}{self.ntemp}"


def _contains(node: ast.AST, kinds: tuple[type, ...]) -> bool:
    """Whether ``node``'s own scope (not nested functions, classes, lambdas) has such a node."""
    stack = list(ast.iter_child_nodes(node))
    while stack:
        n = stack.pop()
        if isinstance(n, kinds):
            return True
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            continue
        stack.extend(ast.iter_child_nodes(n))
    return False


class Normaliser:
    """Puts a module's tree in normal form, numbers its statements and records its sites."""

    def __init__(self, module: str, filename: str, sha256: str):
        self.layout = Layout(module=module, filename=filename, sha256=sha256)
        self.defs: dict[str, ast.FunctionDef] = {}
        self.builtin_wrappers: frozenset[str] = frozenset()

    # -- scopes -----------------------------------------------------------------------------------

    def module(self, tree: ast.Module) -> ast.Module:
        self.builtin_wrappers = ITER_WRAPPERS - bound_names(tree)
        sc = Scope("<module>", "<module>", "module", None, 1)
        self.layout.scopes[sc.key] = sc
        tree.body = self.block(tree.body, _ScopeState(sc), (), "body", "all")
        self.layout.toplevel = [_defines(s) for s in tree.body]
        self.layout.digest = self._digest()
        return tree

    def _qualname(self, name: str, parent: _ScopeState) -> str:
        if parent.scope.kind == "module" and not parent.is_class:
            return name
        if parent.is_class:
            return f"{parent.scope.qualname}.{name}"
        return f"{parent.scope.qualname}.<locals>.{name}"

    def function(self, F: ast.FunctionDef | ast.AsyncFunctionDef, parent: _ScopeState) -> None:
        q = self._qualname(F.name, parent)
        first = min([F.lineno] + [d.lineno for d in F.decorator_list])
        mangle = parent.scope.qualname.rpartition(".")[2] if parent.is_class else parent.scope.mangle
        if isinstance(F, ast.AsyncFunctionDef):
            kind = "async"
        else:
            kind = "generator" if _contains(F, (ast.Yield, ast.YieldFrom)) else "function"
        sc = Scope(f"{q}@{first}", q, kind, mangle, first)
        self.layout.scopes[sc.key] = sc
        F._sj_scope = sc.key  # type: ignore[union-attr]
        state = _ScopeState(sc)
        if kind == "async":
            # Coroutines are not resumable: their body runs as written, without pause points;
            # functions defined inside them still are.
            self._nested_only(F, state)
            return
        self.defs[sc.key] = F  # type: ignore[assignment]
        F.body = self.block(F.body, state, (), "body", "entry" if _contains(F, (ast.Call,)) else "none")

    def classdef(self, C: ast.ClassDef, parent: _ScopeState) -> None:
        q = self._qualname(C.name, parent)
        first = min([C.lineno] + [d.lineno for d in C.decorator_list])
        cs = _ScopeState(Scope(f"{q}@{first}#class", q, "class", parent.scope.mangle, first), is_class=True)
        self.layout.classes.setdefault(q, []).append((first, C.end_lineno or C.lineno))
        C._sj_class = first  # type: ignore[attr-defined]
        self._nested_only(C, cs)

    def _nested_only(self, node: ast.AST, state: _ScopeState) -> None:
        """Class bodies and coroutines run as written; only functions inside them are scopes."""
        for child in ast.iter_child_nodes(node):
            self._visit_nested(child, state)

    def _visit_nested(self, n: ast.AST, state: _ScopeState) -> None:
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef):
            self.function(n, state)
        elif isinstance(n, ast.ClassDef):
            self.classdef(n, state)
        elif not isinstance(n, ast.Lambda):
            for c in ast.iter_child_nodes(n):
                self._visit_nested(c, state)

    # -- statement lists ---------------------------------------------------------------------------

    def block(self, stmts: list[ast.stmt], sc: _ScopeState, prefix: Path, field_: str, checks: str) -> list[ast.stmt]:
        """Normalise one statement list. ``checks``: "all" (module straight code), "head" (loop
        body), "entry" (function body that calls something) or "none"."""
        out: list[ast.stmt] = []
        inner = "all" if checks == "all" else "none"
        want_first = checks in ("head", "entry")
        for i, S in enumerate(stmts):
            start = len(out)
            self.statement(S, sc, prefix, field_, out, inner)
            if start == len(out):
                continue
            first = out[start]
            if checks == "all":
                if not _future_or_docstring(first, i):
                    first._sj_check = True  # type: ignore[attr-defined]
            elif want_first:
                if checks == "entry" and i == 0 and is_docstring(S):
                    continue  # the check goes after the docstring, which must stay first
                first._sj_check = True  # type: ignore[attr-defined]
                want_first = False
        return out

    def emit(self, S: ast.stmt, sc: _ScopeState, prefix: Path, field_: str, out: list[ast.stmt]) -> int:
        sid = len(self.layout.stmts)
        S._sj_sid = sid  # type: ignore[attr-defined]
        self.layout.stmts.append(Stmt(sc.scope.key, (*prefix, (field_, len(out))), S.lineno, type(S).__name__))
        out.append(S)
        self._sites(S, sid, sc)
        return sid

    def _sites(self, S: ast.stmt, sid: int, sc: _ScopeState) -> None:
        v = inline_point(S)
        if isinstance(v, ast.Call):
            arg0 = static_callee(v.args[0]) if v.args and not isinstance(v.args[0], ast.Starred) else None
            self._add_site(sc, v, Site(sid, "call", static_callee(v.func), arg0=arg0))
        elif isinstance(v, ast.Yield):
            self._add_site(sc, v, Site(sid, "yield"))
        elif isinstance(v, ast.YieldFrom) and isinstance(v.value, ast.Name):
            self._add_site(sc, v, Site(sid, "yieldfrom", itvar=v.value.id))

    def _add_site(self, sc: _ScopeState, node: ast.AST, site: Site, at: Span | None = None) -> None:
        key = (sc.scope.key, at or span(node))
        old = self.layout.sites.get(key)
        if old is not None and old != site:
            self.layout.ambiguous.add(key)
        self.layout.sites[key] = site

    def statement(self, S: ast.stmt, sc: _ScopeState, prefix: Path, field_: str, out: list[ast.stmt], inner: str) -> None:
        def sub(stmts: list[ast.stmt], sid: int, f: str, checks: str, extra: Path = ()) -> list[ast.stmt]:
            return self.block(stmts, sc, self.layout.stmts[sid].path + extra, f, checks)

        if isinstance(S, ast.FunctionDef | ast.AsyncFunctionDef):
            self.function(S, sc)
            self.emit(S, sc, prefix, field_, out)
        elif isinstance(S, ast.ClassDef):
            self.classdef(S, sc)
            self.emit(S, sc, prefix, field_, out)
        elif isinstance(S, ast.For):
            self._hook_wrapped_iterables(S)
            temps = self._pre(S.iter, sc, prefix, field_, out, lambda e: setattr(S, "iter", e), top=False)
            itv = sc.temp("it")
            call = ast.Call(func=_name(ITER, ast.Load, S), args=[S.iter], keywords=[])
            # A span of its own (the "fo" of "for") so that it never collides with the FOR_ITER
            # span, which is the whole statement (3.11, 3.12) or the iterator name (3.13).
            _set_span(call, S.lineno, S.col_offset, 2)
            _set_span(call.func, S.lineno, S.col_offset, 2)
            hdr = ast.copy_location(ast.Assign(targets=[_name(itv, ast.Store, S)], value=call), S)
            _set_span(hdr.targets[0], S.lineno, S.col_offset, 3)
            self.emit(hdr, sc, prefix, field_, out)
            self._del(temps, S, sc, prefix, field_, out)
            S.iter = _name(itv, ast.Load, S)
            _set_span(S.iter, S.lineno, S.col_offset, 3)
            sid = self.emit(S, sc, prefix, field_, out)
            site = Site(sid, "foriter", itvar=itv)
            self._add_site(sc, S, site)
            self._add_site(sc, S.iter, site)
            S.body = sub(S.body, sid, "body", "head")
            S.orelse = sub(S.orelse, sid, "orelse", inner)
            self._del([itv], S, sc, prefix, field_, out)
        elif isinstance(S, ast.While):
            sid = self.emit(S, sc, prefix, field_, out)
            S.body = sub(S.body, sid, "body", "head")
            S.orelse = sub(S.orelse, sid, "orelse", inner)
        elif isinstance(S, ast.If):
            self._test(S, "test", sc, prefix, field_, out)
            sid = self.emit(S, sc, prefix, field_, out)
            S.body = sub(S.body, sid, "body", inner)
            S.orelse = sub(S.orelse, sid, "orelse", inner)
        elif isinstance(S, ast.With):
            if len(S.items) > 1:  # `with A, B:` is `with A: with B:` (B is evaluated inside A)
                nested = ast.copy_location(ast.With(items=S.items[1:], body=S.body, type_comment=None), S.items[1].context_expr)
                S.items, S.body = S.items[:1], [nested]
            item = S.items[0]
            temps = self._pre(item.context_expr, sc, prefix, field_, out, lambda e: setattr(item, "context_expr", e), top=True)
            cm = sc.temp("cm")
            hdr = ast.copy_location(ast.Assign(targets=[_name(cm, ast.Store, item.context_expr)], value=item.context_expr), item.context_expr)
            self.emit(hdr, sc, prefix, field_, out)
            self._del(temps, S, sc, prefix, field_, out)
            item.context_expr = _name(cm, ast.Load, item.context_expr)
            sid = self.emit(S, sc, prefix, field_, out)
            self.layout.with_cms[sid] = cm
            S.body = sub(S.body, sid, "body", inner)
            self._del([cm], S, sc, prefix, field_, out)
        elif isinstance(S, ast.Try):
            sid = self.emit(S, sc, prefix, field_, out)
            if may_catch_oom(S.handlers):
                self.layout.catching.add(sid)
            S.body = sub(S.body, sid, "body", inner)
            for h, H in enumerate(S.handlers):
                if H.name is None:
                    H.name = sc.temp("exc")
                H.body = sub(H.body, sid, "body", inner, (("handlers", h),))
            S.orelse = sub(S.orelse, sid, "orelse", inner)
            self._nested_defs(S.finalbody, sc)  # finally blocks run as written: no pause points
        elif isinstance(S, ast.TryStar):
            sid = self.emit(S, sc, prefix, field_, out)
            if S.handlers:
                self.layout.catching.add(sid)
            S.body = sub(S.body, sid, "body", inner)
            S.orelse = sub(S.orelse, sid, "orelse", inner)
            for H in S.handlers:
                self._nested_defs(H.body, sc)
            self._nested_defs(S.finalbody, sc)
        elif isinstance(S, ast.Match):
            self._test(S, "subject", sc, prefix, field_, out)
            sid = self.emit(S, sc, prefix, field_, out)
            for c, case in enumerate(S.cases):
                case.body = sub(case.body, sid, "body", inner, (("cases", c),))
        else:
            self.simple(S, sc, prefix, field_, out)

    def _hook_wrapped_iterables(self, S: ast.For) -> None:
        """``for i, b in enumerate(loader)``: the loader's iterator is made by ``enumerate``,
        out of the iterator hook's sight. Call the hook on the iterables first
        (``enumerate(__sojourn_iter__(loader))``), which is what ``enumerate`` and ``zip``
        do themselves (they call ``iter()`` at once), when the names are the builtins (not
        rebound in the module) and the other arguments are names or constants."""
        call = S.iter
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in self.builtin_wrappers):
            return
        if any(isinstance(a, ast.Starred) for a in call.args) or any(
            kw.arg is None or not pure(kw.value, False) for kw in call.keywords
        ):
            return
        wrap = range(len(call.args)) if call.func.id == "zip" else range(min(1, len(call.args)))
        if any(not pure(a, False) for i, a in enumerate(call.args) if i not in wrap):
            return
        for i in wrap:
            arg = call.args[i]
            hooked = ast.Call(func=_name(ITER, ast.Load, arg), args=[arg], keywords=[])
            # A span no call of the source has (one column wide), so the site stays unique.
            _set_span(hooked, arg.lineno, arg.col_offset, 1)
            _set_span(hooked.func, arg.lineno, arg.col_offset, 1)
            call.args[i] = hooked

    def _nested_defs(self, stmts: list[ast.stmt], sc: _ScopeState) -> None:
        holder = ast.Module(body=stmts, type_ignores=[])
        self._nested_only(holder, sc)

    def simple(self, S: ast.stmt, sc: _ScopeState, prefix: Path, field_: str, out: list[ast.stmt]) -> None:
        temps: list[str] = []
        value = getattr(S, "value", None)
        plain = isinstance(S, ast.Expr | ast.Assign | ast.AnnAssign | ast.Return)
        if value is not None and (plain or (isinstance(S, ast.AugAssign) and isinstance(S.target, ast.Name))):
            temps = self._pre(value, sc, prefix, field_, out, lambda e: setattr(S, "value", e), top=True)
        elif isinstance(S, ast.AugAssign) and _needs_split(S):
            self._augassign(S, sc, prefix, field_, out)
            return
        elif isinstance(S, ast.Raise) and S.exc is not None:
            temps = self._pre(S.exc, sc, prefix, field_, out, lambda e: setattr(S, "exc", e), top=True)
        self.emit(S, sc, prefix, field_, out)
        if not isinstance(S, ast.Return | ast.Raise):
            self._del(temps, S, sc, prefix, field_, out)

    def _augassign(self, S: ast.AugAssign, sc: _ScopeState, prefix: Path, field_: str, out: list[ast.stmt]) -> None:
        """``a[k] += f(g())`` as ``t = a[k]; t += f(g()); a[k] = t``: the target is read before
        the calls, as Python does, and the calls become statements."""
        pre: list[tuple[ast.stmt, str]] = []
        tgt = S.target
        assert isinstance(tgt, ast.Subscript | ast.Attribute)
        obj = self.hoist(tgt.value, pre, sc, False)
        if not isinstance(obj, ast.Name | ast.Constant):
            obj = self._temp_for(obj, pre, sc)
        key: ast.expr | None = None
        if isinstance(tgt, ast.Subscript):
            key = self.hoist(tgt.slice, pre, sc, False)
            if not isinstance(key, ast.Name | ast.Constant):
                key = self._temp_for(key, pre, sc)
            load: ast.expr = ast.Subscript(value=obj, slice=key, ctx=ast.Load())
        else:
            load = ast.Attribute(value=obj, attr=tgt.attr, ctx=ast.Load())
        cur = self._temp_for(located(ast.copy_location(load, tgt), tgt), pre, sc)
        value = self.hoist(S.value, pre, sc, True)
        for stmt, _ in pre:
            self.emit(stmt, sc, prefix, field_, out)
        aug = ast.copy_location(ast.AugAssign(target=_name(cur.id, ast.Store, tgt), op=S.op, value=value), S)
        self.emit(aug, sc, prefix, field_, out)
        if isinstance(tgt, ast.Subscript):
            assert key is not None
            store: ast.expr = ast.Subscript(value=copy.deepcopy(obj), slice=copy.deepcopy(key), ctx=ast.Store())
        else:
            store = ast.Attribute(value=copy.deepcopy(obj), attr=tgt.attr, ctx=ast.Store())
        put = ast.Assign(targets=[located(ast.copy_location(store, tgt), tgt)], value=_name(cur.id, ast.Load, tgt))
        self.emit(ast.copy_location(put, S), sc, prefix, field_, out)
        self._del([t for _, t in pre], S, sc, prefix, field_, out)

    def _pre(self, e: ast.expr, sc: _ScopeState, prefix: Path, field_: str, out: list[ast.stmt], put: Any, top: bool) -> list[str]:
        """Hoist what ``e`` needs into statements before it; returns the temporaries made.
        With ``top`` its last call stays in place."""
        pre: list[tuple[ast.stmt, str]] = []
        put(self.hoist(e, pre, sc, top))
        for stmt, _ in pre:
            self.emit(stmt, sc, prefix, field_, out)
        return [t for _, t in pre]

    def _test(self, S: ast.If | ast.Match, attr: str, sc: _ScopeState, prefix: Path, field_: str, out: list[ast.stmt]) -> None:
        e = getattr(S, attr)
        temps = self._pre(e, sc, prefix, field_, out, lambda v: setattr(S, attr, v), top=True)
        if not temps:
            return  # at most one call, left in the test: the statement is its site
        e = getattr(S, attr)
        t = sc.temp()
        self.emit(ast.copy_location(ast.Assign(targets=[_name(t, ast.Store, e)], value=e), e), sc, prefix, field_, out)
        self._del(temps, S, sc, prefix, field_, out)
        setattr(S, attr, _name(t, ast.Load, e))

    def _del(self, temps: list[str], at: ast.AST, sc: _ScopeState, prefix: Path, field_: str, out: list[ast.stmt]) -> None:
        if temps:
            d = ast.copy_location(ast.Delete(targets=[_name(t, ast.Del, at) for t in temps]), at)
            self.emit(d, sc, prefix, field_, out)

    def hoist(self, e: ast.expr, pre: list[tuple[ast.stmt, str]], sc: _ScopeState, keep: bool) -> ast.expr:
        """Move the suspension points (calls, yields) of ``e`` into temporaries, in evaluation
        order. With ``keep``, the last one stays where it is: the statement itself is then the
        site, and a resume replaces just that call (what was evaluated before it in the
        statement is in temporaries, or is a name or a constant)."""
        if not hoistable(e):
            return e
        if isinstance(e, ast.YieldFrom):
            # The delegate iterator lives on the value stack: keep it in a local instead, as
            # the `for` iterators are (yield from calls iter() on anything but a generator).
            value = self.hoist(e.value, pre, sc, False)
            call = ast.Call(func=_name(ITER, ast.Load, value), args=[value], keywords=[])
            _set_span(call, e.lineno, e.col_offset, 5)  # the "yield" keyword: a span no call has
            _set_span(call.func, e.lineno, e.col_offset, 5)
            e.value = self._temp_for(call, pre, sc)
            return e if keep else self._temp_for(e, pre, sc)
        slots = children(e)
        values = [get(s) for s in slots]
        flags = [hoistable(v) for v in values]
        last = max((i for i, f in enumerate(flags) if f), default=-1)
        inline_here = keep and suspends(e)  # e itself comes after all of its children
        for i, v in enumerate(values):
            if not isinstance(v, ast.expr):
                continue
            if flags[i]:
                put(slots[i], self.hoist(v, pre, sc, keep and not inline_here and i == last))
            elif i < last and not pure(v, isinstance(e, ast.Call) and i == 0):
                if isinstance(v, ast.Starred):
                    v.value = self._temp_for(v.value, pre, sc)
                else:
                    put(slots[i], self._temp_for(v, pre, sc))
        if suspends(e) and not keep:
            return self._temp_for(e, pre, sc)
        return e

    def _temp_for(self, e: ast.expr, pre: list[tuple[ast.stmt, str]], sc: _ScopeState) -> ast.Name:
        t = sc.temp()
        pre.append((ast.copy_location(ast.Assign(targets=[_name(t, ast.Store, e)], value=e), e), t))
        return _name(t, ast.Load, e)

    def _digest(self) -> str:
        h = hashlib.sha256(f"sojourn-layout {TRANSFORM_VERSION}\n".encode())
        for st in self.layout.stmts:
            h.update(f"{st.scope}|{st.path}|{st.kind}\n".encode())
        return h.hexdigest()


def _needs_split(S: ast.AugAssign) -> bool:
    """An augmented assignment to an item or attribute with a call in its value: the target is
    read before the call, so it is read into a temporary first."""
    if not isinstance(S.target, ast.Subscript | ast.Attribute) or not hoistable(S.value):
        return False
    return not (isinstance(S.target, ast.Subscript) and isinstance(S.target.slice, ast.Slice))


def _future_or_docstring(S: ast.stmt, index: int) -> bool:
    if isinstance(S, ast.ImportFrom) and S.module == "__future__":
        return True
    return index == 0 and is_docstring(S)


def _defines(S: ast.stmt) -> tuple[str, tuple[str, ...]]:
    if isinstance(S, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return (type(S).__name__, (S.name,))
    if isinstance(S, ast.Import | ast.ImportFrom):
        return (type(S).__name__, tuple((a.asname or a.name).partition(".")[0] for a in S.names))
    return (type(S).__name__, ())


def normalise(source: str, module: str, filename: str) -> tuple[ast.Module, Layout, dict[str, ast.FunctionDef]]:
    """The normalized tree (with ids, without checks), its layout, and its function nodes."""
    try:
        tree = ast.parse(source, filename)
    except SyntaxError as e:
        raise TransformError(f"{filename} is not valid Python {e.msg}", (e.filename, e.lineno, e.offset, e.text)) from e
    norm = Normaliser(module, filename, source_hash(source))
    tree = norm.module(tree)
    return tree, norm.layout, norm.defs
