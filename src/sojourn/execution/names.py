"""The program's own words for the places a refusal names.

The normal form keeps a loop's iterator in ``_sj_itN``, a ``with`` block's manager in
``_sj_cmN`` and half-evaluated expressions in ``_sj_tN``; a paused frame's locals and the
other modules' globals travel in the capsule's process segment. None of these names mean
anything to the person whose program it is. :func:`path_names` gives the capsule's path
finder (``sojourn.capsule.scan``) the frames' locals and the modules' globals as roots of
their own, and a label for every internal name: ``_sj_it7`` is "the loop `for p in
model.parameters()` (train.py:9)".
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sojourn.execution.position import Position
    from sojourn.execution.runtime import Runtime, TransformedModule

TEMP = "_sj_"


def _source_line(tm: TransformedModule, line: int) -> str:
    lines = tm.source.splitlines()
    text = lines[line - 1].strip() if 0 < line <= len(lines) else ""
    return text[:-1].rstrip() if text.endswith(":") else text


def describe_local(tm: TransformedModule, name: str) -> str:
    """What the engine's local ``name`` of module ``tm`` holds, in the program's words."""
    layout = tm.layout
    base = layout.filename.rsplit("/", 1)[-1]
    if name.startswith(TEMP + "it"):
        for site in layout.sites.values():
            if site.kind == "foriter" and site.itvar == name:
                line = layout.stmts[site.sid].line
                return f"the loop `{_source_line(tm, line)}` ({base}:{line})"
        return "the iterator of a `for` loop"
    if name.startswith(TEMP + "cm"):
        for sid, cm in layout.with_cms.items():
            if cm == name:
                line = layout.stmts[sid].line
                return f"the block `{_source_line(tm, line)}` ({base}:{line})"
        return "the manager of a `with` block"
    return "a value the paused statement computed before the pause"


def path_names(rt: Runtime, pos: Position) -> tuple[dict[str, Any], Any]:
    """(roots in the program's words, label of internal root names) for a paused program."""
    from sojourn.execution.checkpoint import module_globals

    assert rt.main is not None
    main = rt.main
    first: dict[str, Any] = {}
    internal: dict[str, str] = {}
    for i, rec in enumerate(pos.records):
        tm = rt.modules.get(rec.module)
        for k, v in (rec.locals or {}).items():
            if k.startswith(TEMP) and tm is not None:
                key = f"{k}@{i}"
                internal[key] = describe_local(tm, k)
                first[key] = v
            else:
                first[f"<{rec.where}>.{k}"] = v
    for mod, ns in module_globals(rt).items():
        tm = rt.modules.get(mod)
        for k, v in ns.items():
            if k.startswith(TEMP) and tm is not None:
                internal[f"{k}@{mod}"] = describe_local(tm, k)
                first[f"{k}@{mod}"] = v
            else:
                first[f"{mod}.{k}"] = v

    def label(name: str) -> str:
        if name in internal:
            return internal[name]
        if name.startswith(TEMP):
            return describe_local(main, name)
        if name == "<process>":
            return "(the paused program's frames)"
        return name

    return first, label
