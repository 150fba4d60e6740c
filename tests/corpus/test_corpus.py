"""The real-program corpus (tests/corpus/manifest.py): each program, downloaded from a pinned
PyPI archive, run unmoved and then under `sojourn run` with pauses at random points, resumed
each time (alternating interpreters where its libraries exist); the finished output must equal
the unmoved run's, every requested pause must land, and no job may be lost.

The seed is printed (``SOJOURN_CORPUS_SEED`` replays it). ``SOJOURN_CORPUS_PAUSES`` sets the
pauses per program (default 2 for pure Python and numpy, 1 for the others;
``bench/bench_corpus.py`` runs the whole corpus as a table with more). A program whose open finding (``docs/corpus.md``) still fails it is marked
xfail with that reference; the bench table still counts it as a failure.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.corpus import harness
from tests.corpus.manifest import FINDINGS, PROGRAMS, Program

SEED = harness.corpus_seed()
# Pauses per program: 2 for the pure-Python ones, 1 for those whose every pause costs a write
# check and a resume that import torch, pandas or scikit-learn (CI time); the bench runs more.
PAUSES = os.environ.get("SOJOURN_CORPUS_PAUSES")


def _pauses(p: Program) -> int:
    return int(PAUSES) if PAUSES else (2 if p.kind in ("pure-python", "numpy") else 1)


def _param(p: Program) -> object:
    # Programs with torch, pandas or scikit-learn take more than 20 s each (imports, write checks).
    marks = [] if p.kind == "pure-python" else [pytest.mark.slow]
    if p.xfail:
        marks.append(pytest.mark.xfail(reason=p.xfail, strict=False))
    return pytest.param(p, id=p.name, marks=marks)


def _known(text: str) -> str | None:
    for ref, pattern in FINDINGS.items():
        if re.search(pattern, text):
            return ref
    return None


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("corpus-cache")


def test_the_corpus_is_broad_enough() -> None:
    kinds = {p.kind for p in PROGRAMS}
    assert len(PROGRAMS) >= 12
    assert kinds >= {"pure-python", "numpy", "pandas", "torch"}
    assert any("scikit-learn" in p.name for p in PROGRAMS)
    for p in PROGRAMS:
        assert p.note, p.name  # what was replaced, and why, is said


@pytest.mark.parametrize("prog", [_param(p) for p in PROGRAMS])
def test_program_paused_at_random_points_ends_as_an_unmoved_run(prog: Program, tmp_path: Path, cache: Path) -> None:
    print(f"corpus seed {SEED} (replay: SOJOURN_CORPUS_SEED={SEED})")
    o = harness.run_program(prog, tmp_path, cache, SEED, _pauses(prog), log=print)
    print(o.line())
    details = "\n".join(o.refused + o.failed + o.notes + ([o.wrong] if o.wrong else []))
    assert not o.error, o.error
    ref = None if o.ok else _known(details)
    if ref is not None:
        pytest.xfail(f"open finding {ref} (docs/corpus.md): {o.line()}")
    assert not o.lost, f"{o.line()}\n{details}"
    assert not o.failed, f"{o.line()}\n{details}"
    assert not o.wrong, f"{o.line()}\n{details}"
    assert not o.refused, f"{o.line()}\n{details}"
    # A pause asked for while the program was about to end may come too late (the program
    # says so as it ends); one that reached statements of the program and did not land is a
    # miss, which the bench's figures count against the 95 %.
    assert o.landed + o.missed + o.late == o.requested, f"{o.line()}\n{details}"
    assert o.landed >= 1 or o.requested < 2, f"{o.line()}\n{details}"
    assert o.compared
