"""A restore that fails its fingerprint check names the place inside the variable where the
restored value differs, not just the variable."""

from __future__ import annotations

from pathlib import Path

import sojourn
from tests.conftest import run_py


def test_a_mismatch_names_the_attribute_that_came_back_different(tmp_path: Path, repo: str) -> None:
    # A class whose __setstate__ drops part of its state (scikit-learn's Bunch did this to
    # its __dict__): the restored object is not the captured one, and the check says where.
    cap = run_py("""
        import sys, sojourn
        class Lossy:
            def __init__(self):
                self.kept = 1
                self.dropped = [1, 2]
            def __setstate__(self, state):
                self.kept = state["kept"]
        holder = {"inner": [Lossy()], "fine": 3}
        print(sojourn.capture({"holder": holder, "Lossy": Lossy}, sys.argv[1]).id)
    """, repo, cwd=tmp_path)
    report = sojourn.verify(cap.stdout.split()[-1], repo)
    assert not report.ok
    assert "fingerprint mismatch after restore for 'holder' at holder['inner'][0].dropped" in str(report.error), report.error
