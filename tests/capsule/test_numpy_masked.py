"""numpy masked arrays pass the write check and come back with their data, mask and fill value.

Their default fill value is None until asked for, and numpy's own restore stores the
dtype's default array instead: pickled again the restored array differed from the
captured one, so any masked array (scikit-learn's ``cv_results_`` after a fitted search)
failed the check of its own capsule.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import last_json, run_py

np = pytest.importorskip("numpy")


def test_masked_arrays_verify_and_restore(tmp_path: Path, repo: str) -> None:
    import sojourn

    asked = np.ma.masked_array([4.0, 5.0], mask=[True, False])
    _ = asked.fill_value  # asking stores the default
    ns = {
        "plain": np.ma.masked_array([1.0, 2.0, 3.0], mask=[False, True, False]),
        "objects": np.ma.masked_array(np.array([1, "a", None], dtype=object), mask=[False, True, False]),
        "filled": np.ma.masked_array([1, 2], mask=[0, 1], fill_value=7),
        "small": np.ma.masked_array(np.array([1, 2], dtype=np.uint8), mask=[0, 1]),
        "records": np.ma.masked_array(np.zeros(2, dtype=[("a", "i4"), ("b", "f8")]), mask=[(0, 1), (1, 0)]),
        "asked": asked,
    }
    ref = sojourn.capture(ns, repo)
    assert sojourn.verify(ref.id, repo).ok
    proc = run_py(f"""
        import json, numpy as np, sojourn
        ns = sojourn.restore({ref.id!r}, {repo!r})
        out = {{k: [type(v).__name__, v.filled().tolist(), np.ma.getmaskarray(v).tolist(), v.fill_value.tolist()]
               for k, v in ns.items() if isinstance(v, np.ma.MaskedArray)}}
        print(json.dumps(out))
    """, cwd=tmp_path)
    want = {k: [type(v).__name__, v.filled().tolist(), np.ma.getmaskarray(v).tolist(), v.fill_value.tolist()]
            for k, v in ns.items()}
    assert last_json(proc) == json.loads(json.dumps(want))  # records are tuples here, lists there
    assert want["plain"] == ["MaskedArray", [1.0, 1e20, 3.0], [False, True, False], 1e20]


def test_a_fitted_search_passes_its_write_check(repo: str) -> None:
    pytest.importorskip("sklearn")
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import GridSearchCV

    import sojourn

    x = np.random.default_rng(0).normal(size=(40, 3))
    y = (x[:, 0] > 0).astype(int)
    search = GridSearchCV(LogisticRegression(), {"C": [0.1, 1.0]}, cv=2).fit(x, y)
    assert isinstance(search.cv_results_["param_C"], np.ma.MaskedArray)
    report = sojourn.verify(sojourn.capture({"search": search}, repo).id, repo)
    assert report.ok, report.error
