"""Pause checks and out-of-memory guards, inserted into a normalized tree (see :mod:`transform`).

Checks go before the statements the normaliser marked (``_sj_check``); guards wrap every
statement that may run out of memory. Both are added after statement ids are given out, so
they change no id and no site; the same pass runs over resume copies and variants.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from typing import Any

from sojourn.execution.transform import FLAG, OOM, OOMTYPES, PAUSE, _set_span, located


def check_stmt(sid: int, at: ast.AST) -> ast.If:
    call = ast.Call(func=ast.Name(id=PAUSE, ctx=ast.Load()), args=[ast.Constant(sid)], keywords=[])
    test = ast.Compare(left=ast.Name(id=FLAG, ctx=ast.Load()), ops=[ast.IsNot()], comparators=[ast.Constant(None)])
    node = ast.If(test=test, body=[ast.Expr(value=call)], orelse=[])
    return located(ast.copy_location(node, at), at)  # type: ignore[no-any-return]


_GUARDED = (ast.Expr, ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Return, ast.For)


def _needs_guard(S: ast.stmt) -> bool:
    if getattr(S, "_sj_sid", None) is None or not isinstance(S, _GUARDED):
        return False
    if isinstance(S, ast.Expr) and isinstance(S.value, ast.Constant):
        return False  # a docstring must stay the first statement; a constant allocates nothing
    return not (isinstance(S, ast.AnnAssign) and S.value is None)


def guard_stmt(S: ast.stmt) -> ast.Try:
    """``try: S`` / ``except __sojourn_oomtypes__: __sojourn_oom__(sid[, True]); raise``.

    The ``try`` takes the statement's own line, so no instruction is added before it, and the
    handler's nodes get a zero-width span, which no call site of the source has."""
    sid: int = S._sj_sid  # type: ignore[attr-defined]
    line, col = S.lineno, S.col_offset
    args: list[ast.expr] = [ast.Constant(sid)]
    if isinstance(S, ast.For):
        args.append(ast.Constant(True))  # only when raised by the loop's own __next__
    call = ast.Call(func=ast.Name(id=OOM, ctx=ast.Load()), args=args, keywords=[])
    types_ = ast.Name(id=OOMTYPES, ctx=ast.Load())
    body: list[ast.stmt] = [ast.Expr(value=call), ast.Raise(exc=None, cause=None)]
    handler = ast.ExceptHandler(type=types_, name=None, body=body)
    for n in [handler, types_, *body, *ast.walk(call)]:
        _set_span(n, line, col, 0)
    node = ast.Try(body=[S], handlers=[handler], orelse=[], finalbody=[])
    return ast.copy_location(node, S)


def _stmt_lists(node: ast.AST) -> Iterator[tuple[Any, str]]:
    for name in ("body", "orelse", "finalbody"):
        value = getattr(node, name, None)
        if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
            yield node, name
    for h in getattr(node, "handlers", ()) or ():
        yield h, "body"
    for c in getattr(node, "cases", ()) or ():
        yield c, "body"


def instrument(node: ast.AST) -> ast.AST:
    """Insert a pause check before every statement marked for one, and wrap the statements
    that may run out of memory in a guard (in place)."""
    for owner, name in list(_stmt_lists(node)):
        out: list[ast.stmt] = []
        for S in getattr(owner, name):
            instrument(S)
            if getattr(S, "_sj_check", False) and not getattr(S, "_sj_nocheck", False):
                out.append(check_stmt(S._sj_sid, S))  # type: ignore[attr-defined]
            out.append(guard_stmt(S) if _needs_guard(S) else S)
        setattr(owner, name, out)
    return node
