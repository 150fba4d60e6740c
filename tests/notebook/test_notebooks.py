"""Real notebooks on the sojourn kernel: a plain run, and a run whose kernel moves to a fresh
process before every cell, give the same outputs cell for cell (execution counts included).
Autosave runs in the background after every cell: same outputs again, overhead measured."""

from __future__ import annotations

import statistics

import pytest

from tests.notebook.conftest import NOTEBOOKS
from tests.notebook.nbrun import outputs, run

CASES = ["analysis.ipynb", "training.ipynb", "classes.ipynb", "plots.ipynb"]


@pytest.mark.parametrize("name", CASES)
def test_move_between_every_cell_gives_identical_outputs(name: str, jupyter) -> None:
    plain = run(NOTEBOOKS / name, jupyter)
    moved = run(NOTEBOOKS / name, jupyter, move_to="local")
    ncells = len(outputs(plain))
    assert len(moved.moves) == ncells - 1
    for m in moved.moves:
        assert m["before"] != m["after"], f"the kernel did not change process: {m}"
        assert "moved to local" in m["text"], m["text"]
    a, b = outputs(plain), outputs(moved)
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        assert x == y, f"cell {i} differs after moves:\nplain: {x}\nmoved: {y}"
    errors = [o for _, outs in a for o in outs if o.get("output_type") == "error"]
    assert not errors, errors


@pytest.mark.parametrize("name", CASES)
def test_autosave_after_every_cell_is_background_and_changes_nothing(name: str, jupyter, monkeypatch) -> None:
    plain = run(NOTEBOOKS / name, jupyter)
    monkeypatch.setenv("SOJOURN_AUTOSAVE", "1")
    saved = run(NOTEBOOKS / name, jupyter)
    assert outputs(plain) == outputs(saved)
    report = saved.autosave_report
    assert report, saved.extra_outputs
    assert all(r["ok"] for r in report), report
    blocking = [r["blocking"] * 1000 for r in report]
    print(f"\n{name}: {len(report)} autosaves, blocking ms per cell: median "
          f"{statistics.median(blocking):.1f}, max {max(blocking):.1f}; background s: "
          f"{[round(r['seconds'], 2) for r in report]}; written KiB: {[r['written'] // 1024 for r in report]}")
    # fork time: a few ms here; generous for loaded CI machines
    assert statistics.median(blocking) < 100
