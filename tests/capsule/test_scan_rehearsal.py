"""``sojourn.scan`` predicts the write check: what would come back different from a capsule
(and so fail the check) is named by its path before any pause, and what passes the check
is not named (no false alarm on the library values sojourn carries)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import last_json, run_py


def test_scan_names_what_the_write_check_would_refuse(tmp_path: Path, repo: str) -> None:
    res = run_py("""
        import json, sys, sojourn
        class Lossy:
            def __init__(self):
                self.kept = 1
                self.dropped = [1, 2]
            def __setstate__(self, state):
                self.kept = state["kept"]
        holder = {"inner": [Lossy()], "fine": 3}
        problems = sojourn.scan({"holder": holder, "Lossy": Lossy, "other": [1, 2]})
        cap = sojourn.capture({"holder": holder, "Lossy": Lossy}, sys.argv[1])
        report = sojourn.verify(cap.id, sys.argv[1])
        print(json.dumps({"scan": [[p.path, p.reason] for p in problems], "verify": report.error}))
    """, repo, cwd=tmp_path)
    out = last_json(res)
    assert [p for p, _ in out["scan"]] == ["holder['inner'][0].dropped"], out  # type: ignore[index]
    assert "write check would refuse" in out["scan"][0][1]  # type: ignore[index]
    assert "holder['inner'][0].dropped" in out["verify"]  # type: ignore[index,operator]  # and it does


@pytest.mark.slow
def test_scan_raises_no_false_alarm_on_library_values(tmp_path: Path, repo: str) -> None:
    pytest.importorskip("pandas")
    pytest.importorskip("sklearn")
    pytest.importorskip("torch")
    res = run_py("""
        import json, sys, sojourn
        import numpy as np, pandas as pd, torch
        from sklearn.utils import Bunch
        df = pd.DataFrame({"k": list("abab"), "v": np.arange(4.0)})
        model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU())
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        ns = {"frames": [df, df.copy()], "pieces": list(df.groupby("k")), "col": df["v"],
              "bunch": Bunch(a=1, b=[1, 2]), "masked": np.ma.array([1.0, 2.0], mask=[0, 1]),
              "model": model, "opt": opt,
              "sched": torch.optim.lr_scheduler.StepLR(opt, 2), "big": np.arange(10 ** 6.0)}
        problems = sojourn.scan(ns)
        cap = sojourn.capture(ns, sys.argv[1])
        print(json.dumps({"scan": [str(p) for p in problems], "verify": sojourn.verify(cap.id, sys.argv[1]).ok}))
    """, repo, cwd=tmp_path)
    assert last_json(res) == {"scan": [], "verify": True}
