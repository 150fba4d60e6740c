"""Library values whose parts are shared (pandas blocks and copy-on-write references,
masked arrays over other arrays, scikit-learn's Bunch) pass the write check and behave,
after a restore in a fresh interpreter, as the program that never moved: the same values,
the same sharing, and the same copies before a write."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.capsule.test_data_libs import _roundtrip

pytest.importorskip("pandas")
pytest.importorskip("sklearn")


def test_pandas_copies_groupby_pieces_and_copy_on_write(tmp_path: Path, repo: str) -> None:
    # ``df.copy()`` and groupby pieces share their frame's block placements; before the
    # reducers here each of these failed the write check (fingerprint mismatch). And a
    # Series or Index over a frame's memory must still be copied before the frame is written.
    _, before, after = _roundtrip(tmp_path, repo, """
        import numpy as np, pandas as pd
        df = pd.DataFrame({"k": ["a", "b", "a", "c"], "v": np.arange(4.0), "w": np.arange(4) * 10,
                           "t": pd.date_range("2024-01-01", periods=4, tz="UTC")})
        pair = [df, df.copy()]
        pieces = list(df.groupby("k"))
        col = df["v"]
        idx = pd.Index(df["w"])
        sliced = df.iloc[1:3]
        """, """
        import numpy as np
        out["pair"] = [pair[0] is df, pair[1] is df, pair[1].equals(df)]
        out["pieces"] = [[k, g.to_json()] for k, g in pieces]
        out["shares"] = [bool(np.shares_memory(col.to_numpy(), df["v"].to_numpy())),
                         bool(np.shares_memory(sliced["v"].to_numpy(), df["v"].to_numpy()))]
        # Writes into the frame leave what was taken from it alone (pandas copies first).
        df.loc[0, "v"] = 99.0
        df.loc[1, "w"] = -1
        out["after_write"] = [col.tolist(), idx.tolist(), sliced["v"].tolist(), pair[1]["v"].tolist(),
                              df["v"].tolist(), df["w"].tolist()]
        """)
    assert after == before
    assert before["after_write"][0] == [0.0, 1.0, 2.0, 3.0]
    assert before["after_write"][1] == [0, 10, 20, 30]


def test_masked_arrays_keep_their_attributes_and_memory(tmp_path: Path, repo: str) -> None:
    _, before, after = _roundtrip(tmp_path, repo, """
        import numpy as np
        x = np.arange(6.0)
        over = np.ma.masked_array(x, mask=[0, 1, 0, 0, 1, 0])   # shares x's memory
        hard = np.ma.array([1, 2, 3], mask=[0, 1, 0], hard_mask=True)
        filled = np.ma.array([1.5, 2.5], mask=[1, 0], fill_value=-7.0)
        owned = over.copy()                                     # owns its memory
        owned_view = owned[1:4]
        owned_data = owned.data
        objects = np.ma.MaskedArray(np.empty(3, dtype=object), mask=True)  # cv_results_ columns
        objects[1] = {"C": 1}
        no_mask = np.ma.masked_array([4, 5])
        """, """
        import numpy as np
        def show(m):
            return [np.ma.getdata(m).tolist() if m.dtype != object else repr(m.data.tolist()),
                    np.ma.getmaskarray(m).tolist(), repr(m._fill_value), m.hardmask, str(m.dtype)]
        out["values"] = [show(m) for m in (over, hard, filled, owned, owned_view, objects, no_mask)]
        out["no_mask"] = no_mask._mask is np.ma.nomask
        out["owned_data"] = owned_data.tolist()
        hard[1] = 9                                # a hard mask keeps the masked value
        x[0] = 42.0                                # ``over`` sees it, ``owned`` does not
        owned[2] = 8.0                             # its views see it
        out["writes"] = [hard.data.tolist(), over.data.tolist(), owned.data.tolist(),
                         owned_view.data.tolist(), owned_data.tolist()]
        """)
    assert after == before
    assert before["writes"][0] == [1, 2, 3]
    assert before["writes"][1][0] == 42.0


def test_scikit_learn_bunch_and_grid_search_results(tmp_path: Path, repo: str) -> None:
    _, before, after = _roundtrip(tmp_path, repo, """
        from sklearn.utils import Bunch
        from sklearn.datasets import make_classification
        from sklearn.linear_model import LogisticRegression
        from sklearn.model_selection import GridSearchCV
        small = Bunch(a=1, b=[1, 2])
        small.c = small.b                                  # attribute writes are items
        X, y = make_classification(60, random_state=0)
        search = GridSearchCV(LogisticRegression(), {"C": [0.1, 1.0]}, cv=3).fit(X, y)
        results = search.cv_results_
        """, """
        out["small"] = [dict(small), small.a, small.c is small.b, sorted(vars(small))]
        out["results"] = [sorted(results), [repr(v) for v in results["param_C"]],
                          results["mean_test_score"].round(6).tolist(), search.best_params_]
        """)
    assert after == before
