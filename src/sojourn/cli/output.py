"""Tables for people, JSON for programs."""

from __future__ import annotations

import json
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


def table(title: str | None, columns: list[str], rows: list[list[Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title, title_justify="left", show_edge=False, header_style="bold")
    for c in columns:
        t.add_column(c, overflow="fold")
    for r in rows:
        t.add_row(*[str(x) for x in r])
    Console().print(t)
