"""Cells are parsed so that their generator functions resume from source (see
:mod:`sojourn.execution.cells`): IPython's ``compile.ast_parse`` is wrapped, per shell."""

from __future__ import annotations

from typing import Any


def install(shell: Any) -> None:
    # The program's reducers for generators, coroutines and adopted functions, before the
    # first capture: without them a generator would be refused with a script's advice.
    import sojourn.execution.reducers  # noqa: F401
    from sojourn.execution import cells

    cells.IN_NOTEBOOK = True
    compiler: Any = getattr(shell, "compile", None)
    parse = getattr(compiler, "ast_parse", None)
    if parse is None or getattr(parse, "_sojourn", False):
        return

    def ast_parse(source: str, filename: str = "<unknown>", symbol: str = "exec", *args: Any, **kw: Any) -> Any:
        tree = parse(source, filename, symbol, *args, **kw)
        if symbol == "exec" and "yield" in source:  # cheap: most cells define no generator
            try:
                tree = cells.prepare(source, filename, tree, shell.user_ns)
            except Exception:  # never let this break a cell: its generators are then refused
                pass
        return tree

    ast_parse._sojourn = True  # type: ignore[attr-defined]
    compiler.ast_parse = ast_parse
