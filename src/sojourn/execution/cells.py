"""Generator functions defined in notebook cells resume from their source, like a script's.

A generator's state is its frame, which no serializer can carry; under ``sojourn run`` a
generator of the program travels as (statement id, locals) and is rebuilt from the normal
form of its source (:mod:`reducers`, :mod:`resumeform`). A notebook cell is a small source
of its own, so the same machinery applies to it:

* when a cell is parsed (IPython's ``compile.ast_parse``, wrapped by the notebook extension),
  a cell that defines generator functions at its top level is put in normal form as a module
  of the runtime named ``__sojourn_cell_<hash>`` whose namespace is the kernel's ``user_ns``
  (its module code never runs: IPython runs the cell as usual);
* right after each such ``def``, the function gets the normal form's code for its scope
  (``__sojourn_adopt__``), so the generators it makes are the program's own: they carry
  their statement ids, and pausing, capturing and rebuilding them is what a script does;
* the cell's module travels in the capsule as its source (``load_cell``, the first time a
  generator or function of it is written), so any fresh interpreter that restores the
  capsule compiles the cell again before its generators are rebuilt, with the restored
  namespace as its globals.

Only plain top-level generator functions are adopted: a decorated one (the decorator may
hold the original function) and generator methods of classes defined in cells keep
IPython's code, and their generators are refused with a reason that says so.
"""

from __future__ import annotations

import ast
import hashlib
import linecache
import types
from typing import Any

from sojourn.execution.runtime import RUNTIME, TransformedModule

PREFIX = "__sojourn_cell_"
ADOPT = "__sojourn_adopt__"
# Set by the notebook extension: refusals then give advice for cells, not for scripts.
IN_NOTEBOOK = False


def is_cell(tm: TransformedModule) -> bool:
    return tm.name.startswith(PREFIX)


def _own_scope_yields(fn: ast.FunctionDef) -> bool:
    stack: list[ast.AST] = [*fn.body]
    while stack:
        n = stack.pop()
        if isinstance(n, ast.Yield | ast.YieldFrom):
            return True
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            continue
        stack.extend(ast.iter_child_nodes(n))
    return False


def generator_defs(tree: ast.Module) -> list[ast.FunctionDef]:
    """The cell's top-level, undecorated generator functions."""
    return [n for n in tree.body
            if isinstance(n, ast.FunctionDef) and not n.decorator_list and _own_scope_yields(n)]


def prepare(source: str, filename: str, tree: ast.Module, namespace: dict[str, Any]) -> ast.Module:
    """``tree`` (IPython's parse of the cell ``source``), with an adoption after each
    generator function's ``def``. A cell the normal form cannot take (top-level ``await``,
    say) is left as it is: its generators are then refused when captured, with the reason."""
    defs = generator_defs(tree)
    if not defs:
        return tree
    name = PREFIX + hashlib.sha256(f"{filename}\0{source}".encode()).hexdigest()[:16]
    try:
        _module(name, filename, source, namespace)
    except SyntaxError:
        return tree
    namespace[ADOPT] = adopt
    body: list[ast.stmt] = []
    for node in tree.body:
        body.append(node)
        if node in defs:
            call = ast.Expr(ast.Call(ast.Name(ADOPT, ast.Load()), [ast.Name(node.name, ast.Load()),
                                                                   ast.Constant(name)], []))
            body.append(ast.copy_location(call, node))
    tree.body = body
    ast.fix_missing_locations(tree)
    return tree


def _module(name: str, filename: str, source: str, namespace: dict[str, Any]) -> TransformedModule:
    """The cell's module in this process, compiled once per (cell, namespace). Its runtime
    names are put in the namespace again each time: ``%reset`` empties ``user_ns``."""
    tm = RUNTIME.modules.get(name)
    if tm is None or tm.source != source or tm.namespace is not namespace:
        return RUNTIME.load(source, name, filename, namespace)
    RUNTIME.install(tm)
    return tm


def adopt(fn: Any, module: str) -> None:
    """Give a cell's generator function the normal form's code of its scope."""
    tm = RUNTIME.modules.get(module)
    code = getattr(fn, "__code__", None)
    if tm is None or not isinstance(code, types.CodeType) or code.co_freevars:
        return
    new = tm.scope_code.get(f"{code.co_qualname}@{code.co_firstlineno}")
    if new is not None and not new.co_freevars:
        fn.__code__ = new


def load_cell(name: str, filename: str, source: str) -> TransformedModule:
    """On restore: the cell's module, compiled again here, its globals the namespace being
    restored (the kernel's ``user_ns``)."""
    from sojourn.capsule.context import current

    namespace = current().namespace
    tm = _module(name, filename, source, namespace)
    namespace[ADOPT] = adopt
    # Tracebacks and inspect show the cell's lines, as in the kernel it came from.
    linecache.cache.setdefault(filename, (len(source), None, source.splitlines(True), filename))
    return tm
