"""Tables for people, JSON for programs."""

from __future__ import annotations

import json
import sys
from typing import Any

import click


def human_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


# Past this many rows a table is printed as plain aligned text: rich measures and wraps every
# cell (about 0.7 ms a row), which made `sojourn ps` over 1,000 workspaces take 3/4 of a
# second, and a listing that long is read with a pager or grep, one line a row, anyway.
PLAIN_ROWS = 100


def table(title: str | None, columns: list[str], rows: list[list[Any]]) -> None:
    if len(rows) > PLAIN_ROWS:
        _plain_table(title, columns, [[str(x) for x in r] for r in rows])
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title, title_justify="left", show_edge=False, header_style="bold")
    for c in columns:
        t.add_column(c, overflow="fold")
    for r in rows:
        t.add_row(*[str(x) for x in r])
    Console().print(t)


def _cell_width(text: str) -> int:
    if text.isascii():
        return len(text)
    from rich.cells import cell_len  # wide (CJK) and zero-width characters, as rich counts them

    return cell_len(text)


def _plain_table(title: str | None, columns: list[str], rows: list[list[str]]) -> None:
    """The rich table's columns and rules, one line a row: cells are neither wrapped nor folded."""
    widths = [_cell_width(c) for c in columns]
    for r in rows:
        for i, cell in enumerate(r):
            w = _cell_width(cell)
            if w > widths[i]:
                widths[i] = w
    head, rule, cross, bar = "┃", "━", "╇", "│"
    try:
        (head + rule + cross + bar).encode(sys.stdout.encoding or "ascii")
    except (UnicodeEncodeError, LookupError):  # rich falls back to ASCII boxes there too
        head, rule, cross, bar = "|", "-", "+", "|"

    def line(cells: list[str], sep: str) -> str:
        cells = cells + [""] * (len(widths) - len(cells))
        padded = [c + " " * (w - _cell_width(c)) for c, w in zip(cells, widths, strict=True)]
        return (" " + f" {sep} ".join(padded)).rstrip()

    out = [title] if title else []
    out.append(click.style(line(columns, head), bold=True))
    out.append(cross.join(rule * (w + 2) for w in widths))
    out.extend(line(r, bar) for r in rows)
    click.echo("\n".join(out))
