"""Expressions in the normal form: which sub-expressions hoisting may enter, and in what order.

A *suspension point* is a call, a ``yield`` or a ``yield from``: where a frame can wait for
another. Hoisting enters only the forms that evaluate all of their operands, left to right;
lazy forms (``and``/``or``, conditional expressions, chained comparisons, comprehensions,
lambdas, ``:=``) are left whole, and a pause inside one waits until its statement is done.
"""

from __future__ import annotations

import ast
import builtins
from typing import Any


def children(e: ast.expr) -> list[tuple[Any, Any]]:
    """(container, key) of the sub-expressions hoisting may enter, in evaluation order.

    Short-circuit and lazy forms (``and``/``or``, ``x if c else y``, chained comparisons,
    comprehensions, lambdas, ``:=``) have none: a call inside them is not hoisted, and a pause
    inside it waits until the statement is done.
    """
    if isinstance(e, ast.Call):
        return [(e, "func"), *[(e.args, i) for i in range(len(e.args))], *[(kw, "value") for kw in e.keywords]]
    if isinstance(e, ast.BinOp):
        return [(e, "left"), (e, "right")]
    if isinstance(e, ast.UnaryOp):
        return [(e, "operand")]
    if isinstance(e, ast.Compare) and len(e.ops) == 1:
        return [(e, "left"), (e.comparators, 0)]
    if isinstance(e, ast.Attribute | ast.Starred | ast.Yield | ast.YieldFrom):
        return [(e, "value")] if getattr(e, "value", None) is not None else []
    if isinstance(e, ast.Subscript):
        return [(e, "value"), (e, "slice")]
    if isinstance(e, ast.Slice):
        return [(e, k) for k in ("lower", "upper", "step") if getattr(e, k) is not None]
    if isinstance(e, ast.List | ast.Tuple | ast.Set):
        return [(e.elts, i) for i in range(len(e.elts))]
    if isinstance(e, ast.Dict):
        out: list[tuple[Any, Any]] = []
        for i in range(len(e.values)):
            if e.keys[i] is not None:
                out.append((e.keys, i))
            out.append((e.values, i))
        return out
    if isinstance(e, ast.JoinedStr):
        return [(e.values, i) for i in range(len(e.values))]
    if isinstance(e, ast.FormattedValue):
        return [(e, "value")] + ([(e, "format_spec")] if e.format_spec is not None else [])
    return []


def get(slot: tuple[Any, Any]) -> Any:
    c, k = slot
    return c[k] if isinstance(c, list) else getattr(c, k)


def put(slot: tuple[Any, Any], value: Any) -> None:
    c, k = slot
    if isinstance(c, list):
        c[k] = value
    else:
        setattr(c, k, value)


def suspends(e: ast.expr) -> bool:
    return isinstance(e, ast.Call | ast.Yield | ast.YieldFrom)


def hoistable(e: Any) -> bool:
    if not isinstance(e, ast.expr):
        return False
    if suspends(e):
        return True
    return any(hoistable(get(s)) for s in children(e))


def pure(e: ast.expr, is_func: bool) -> bool:
    """Evaluating ``e`` earlier or later gives the same value (our documented assumption for
    names; a method lookup is not expected to change because of an argument's call)."""
    if isinstance(e, ast.Constant | ast.Name | ast.Lambda | ast.Slice):
        return True
    if is_func:
        while isinstance(e, ast.Attribute):
            e = e.value
        return isinstance(e, ast.Name)
    return False


def static_callee(e: ast.expr) -> tuple[tuple[str, str], ...] | None:
    parts: list[tuple[str, str]] = []
    while isinstance(e, ast.Attribute):
        parts.append(("a", e.attr))
        e = e.value
    if not isinstance(e, ast.Name):
        return None
    parts.append(("n", e.id))
    return tuple(reversed(parts))


def inline_points(e: Any) -> list[ast.expr]:
    if not isinstance(e, ast.expr):
        return []
    out = [e] if suspends(e) else []
    for slot in children(e):
        out += inline_points(get(slot))
    return out


def value_field(S: ast.stmt) -> str | None:
    """Where a statement keeps the expression whose one call may be a site."""
    if isinstance(S, ast.Expr | ast.Assign | ast.AnnAssign | ast.Return):
        return "value"
    if isinstance(S, ast.AugAssign):
        return "value" if isinstance(S.target, ast.Name) else None
    if isinstance(S, ast.Raise):
        return "exc"
    if isinstance(S, ast.If):
        return "test"
    if isinstance(S, ast.Match):
        return "subject"
    return None


def inline_point(S: ast.stmt) -> ast.expr | None:
    """The one call or yield a statement waits in, if it has exactly one (outside lazy forms)."""
    name = value_field(S)
    points = inline_points(getattr(S, name, None)) if name else []
    return points[0] if len(points) == 1 else None


# Builtins that call iter() on their arguments at once: a `for` over them passes those
# arguments through the iterator hook first (see Normaliser._hook_wrapped_iterables).
ITER_WRAPPERS = frozenset({"enumerate", "zip"})

# Builtin exception classes that cannot catch a MemoryError or a RuntimeError (torch's OOM).
_NOT_OOM = frozenset(
    n for n, v in vars(builtins).items()
    if isinstance(v, type) and issubclass(v, BaseException)
    and not issubclass(MemoryError, v) and not issubclass(RuntimeError, v)
)


def may_catch_oom(handlers: list[ast.ExceptHandler]) -> bool:
    """Whether one of these handlers may catch an out-of-memory error: yes unless each names
    only builtin exceptions that cannot (a name of the program's own may alias anything)."""
    for H in handlers:
        names = H.type.elts if isinstance(H.type, ast.Tuple) else [H.type]
        if any(not (isinstance(n, ast.Name) and n.id in _NOT_OOM) for n in names):
            return True
    return False


def bound_names(tree: ast.Module) -> set[str]:
    """Every name the module binds anywhere (assignments, parameters, imports, definitions)."""
    out: set[str] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load):
            out.add(n.id)
        elif isinstance(n, ast.arg):
            out.add(n.arg)
        elif isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out.add(n.name)
        elif isinstance(n, ast.alias):
            out.add((n.asname or n.name).partition(".")[0])
        elif isinstance(n, ast.Global | ast.Nonlocal):
            out.update(n.names)
    return out
