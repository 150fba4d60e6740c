"""Tables for people: past PLAIN_ROWS rows, one aligned line a row (what `sojourn ps` prints)."""

from __future__ import annotations

import pytest
from rich.cells import cell_len

from sojourn.cli import output


def test_a_long_table_is_one_aligned_line_a_row(capsys: pytest.CaptureFixture[str]) -> None:
    columns = ["WORKSPACE", "NAME", "SIZE"]
    rows: list[list[object]] = [[f"ws_{i:012x}", f"train-{i}", i * 1000] for i in range(output.PLAIN_ROWS + 5)]
    rows[3][1] = "训练-wide"  # two cells per character: alignment counts cells, not characters
    rows[7][1] = "[bold]not markup[/bold]"
    output.table(None, columns, rows)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 + len(rows)
    header, rule, body = lines[0], lines[1], lines[2:]
    assert header.split() == ["WORKSPACE", "┃", "NAME", "┃", "SIZE"]
    for line, row in zip(body, rows, strict=True):
        assert [c.strip() for c in line.split("│")] == [str(x) for x in row]

    def bars(line: str, sep: str) -> list[int]:
        return [cell_len(line[:i]) for i, ch in enumerate(line) if ch == sep]

    assert bars(rule, "╇") == bars(header, "┃")
    assert all(bars(line, "│") == bars(header, "┃") for line in body)


def test_a_short_table_is_still_drawn_by_rich(capsys: pytest.CaptureFixture[str]) -> None:
    output.table("few", ["A", "B"], [["x", "y"]] * output.PLAIN_ROWS)
    out = capsys.readouterr().out
    assert out.startswith("few") and "A" in out and out.count("x") == output.PLAIN_ROWS
