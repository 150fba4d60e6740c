"""pandas, scipy.sparse and scikit-learn objects round-trip through a fresh interpreter with
their values, dtypes and aliasing, and pass ``sojourn.verify``."""

from __future__ import annotations

import importlib.metadata as md
import json
import textwrap
from pathlib import Path

import pytest

import sojourn
from tests.conftest import last_json, run_py

pytest.importorskip("pandas")
pytest.importorskip("scipy")
pytest.importorskip("sklearn")


def _roundtrip(tmp_path: Path, repo: str, setup: str, checks: str) -> tuple[str, dict, dict]:
    """Capture ``setup``'s globals; run ``checks`` (filling ``out``) before capture and after restore."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    checks = textwrap.dedent(checks)
    cap = run_py(
        "import sys, json, sojourn\n" + textwrap.dedent(setup)
        + "\nref = sojourn.capture(globals(), sys.argv[1])\nout = {}\n" + checks
        + "\nprint(ref.id)\nprint(json.dumps(out))\n",
        repo, cwd=src,
    )
    capsule = cap.stdout.splitlines()[-2].strip()
    before = json.loads(cap.stdout.splitlines()[-1])
    report = sojourn.verify(capsule, repo)
    assert report.ok, report.error
    res = run_py(
        "import sys, json, sojourn\nns = sojourn.restore(sys.argv[2], sys.argv[1], into=globals())\nout = {}\n"
        + checks + "\nprint(json.dumps(out))\n",
        repo, capsule, cwd=dst,
    )
    return capsule, before, last_json(res)  # type: ignore[return-value]


def test_pandas_frames_and_series(tmp_path: Path, repo: str) -> None:
    capsule, before, after = _roundtrip(tmp_path, repo, """
        import numpy as np, pandas as pd
        idx = pd.MultiIndex.from_product([["a", "b"], [1, 2, 3]], names=["k", "n"])
        shared_cat = pd.CategoricalDtype(categories=list("zyx"), ordered=True)
        df = pd.DataFrame({
            "cat": pd.Categorical(list("xyzxyz"), dtype=shared_cat),
            "when": pd.date_range("2024-03-30", periods=6, freq="12h", tz="Europe/Paris"),  # crosses DST
            "naive": pd.date_range("2024-01-01", periods=6, freq="D"),
            "delta": pd.to_timedelta(np.arange(6), unit="s"),
            "val": np.arange(6.0),
            "obj": [1, "two", None, 3.5, [1], {"k": 1}],
            "nullable": pd.array([1, None, 3, 4, 5, 6], dtype="Int64"),
            "text": pd.array(["a", None, "c", "d", "e", "f"], dtype="string"),
        }, index=idx)
        df.attrs["source"] = "sensor"
        wide = pd.DataFrame(np.arange(8).reshape(2, 4),
                            columns=pd.MultiIndex.from_tuples([("x", 1), ("x", 2), ("y", 1), ("y", 2)]))
        s = pd.Series([1.5, np.nan, 3.0], index=pd.Index(["u", "v", "w"], name="letters"), name="ser")
        other = pd.Series(pd.Categorical(["x", "z"], dtype=shared_cat))
        alias = df
        frames = {"first": df, "again": df}
        """, """
        import pandas as pd
        out["frame"] = df.to_json(orient="split", date_format="iso")
        out["dtypes"] = [str(t) for t in df.dtypes]
        out["index"] = [list(df.index.names), df.index.tolist(), wide.columns.tolist()]
        out["tz"] = [str(df["when"].dt.tz), df["when"].iloc[3].isoformat()]
        out["cat"] = [df["cat"].cat.categories.tolist(), df["cat"].cat.ordered, df["cat"].cat.codes.tolist(),
                      other.dtype == df["cat"].dtype]
        out["series"] = [s.to_json(), s.name, s.index.name, str(s.dtype)]
        out["attrs"] = df.attrs
        out["aliases"] = [alias is df, frames["first"] is df, frames["again"] is df]
        out["obj"] = [df["obj"].iloc[4], df["obj"].iloc[5]]
        """)
    assert after == before
    assert after["aliases"] == [True, True, True]
    assert after["tz"][0] == "Europe/Paris"
    assert after["dtypes"][0] == "category" and after["dtypes"][1].endswith(", Europe/Paris]")
    assert after["dtypes"][6] == "Int64"
    info = sojourn.inspect(capsule, repo)
    assert info.distributions["pandas"] == md.version("pandas")


def test_scipy_sparse_matrices(tmp_path: Path, repo: str) -> None:
    capsule, before, after = _roundtrip(tmp_path, repo, """
        import numpy as np
        import scipy.sparse as sp
        csr = sp.random(30, 12, density=0.2, format="csr", random_state=0, dtype=np.float64)
        csc = csr.tocsc()
        coo = csr.tocoo()
        lil = csr.tolil()
        arr = sp.csr_array(csr)
        ints = sp.diags([1, 2, 3], offsets=0, format="dia", dtype=np.int32)
        same = {"a": csr, "b": csr}
        """, """
        out["dense"] = [m.toarray().round(12).tolist() for m in (csr, csc, coo, lil, arr, ints)]
        out["meta"] = [[m.format, str(m.dtype), m.shape, int(m.nnz), type(m).__name__] for m in (csr, csc, coo, lil, arr, ints)]
        out["alias"] = same["a"] is same["b"] and same["a"] is csr
        out["product"] = (csr @ csr.T).toarray().sum().round(9)
        """)
    assert after == before
    assert after["alias"] is True
    assert sojourn.inspect(capsule, repo).distributions["scipy"] == md.version("scipy")


def test_fitted_scikit_learn_estimators(tmp_path: Path, repo: str) -> None:
    capsule, before, after = _roundtrip(tmp_path, repo, """
        import numpy as np, pandas as pd
        from sklearn.cluster import KMeans
        from sklearn.ensemble import RandomForestClassifier
        from sklearn.linear_model import LogisticRegression
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler
        rng = np.random.default_rng(0)
        X = pd.DataFrame(rng.normal(size=(80, 4)), columns=["a", "b", "c", "d"])
        y = (X["a"] + X["b"] > 0).astype(int)
        pipe = make_pipeline(StandardScaler(), LogisticRegression()).fit(X, y)
        forest = RandomForestClassifier(n_estimators=7, random_state=0).fit(X, y)
        km = KMeans(n_clusters=3, n_init=2, random_state=0).fit(X)
        scaler = pipe.named_steps["standardscaler"]
        """, """
        from sklearn.pipeline import Pipeline
        from sklearn.preprocessing import StandardScaler
        out["predict"] = [pipe.predict_proba(X).round(12).tolist(), forest.predict_proba(X).tolist(),
                          km.predict(X).tolist()]
        out["fitted"] = [pipe[-1].coef_.tolist(), scaler.mean_.tolist(), float(scaler.n_samples_seen_),
                         list(pipe.feature_names_in_), km.cluster_centers_.round(12).tolist(), forest.n_features_in_]
        out["identity"] = [scaler is pipe.steps[0][1], isinstance(pipe, Pipeline), isinstance(scaler, StandardScaler)]
        out["version"] = forest.__getstate__()["_sklearn_version"]
        """)
    assert after == before
    assert after["identity"] == [True, True, True]
    dists = sojourn.inspect(capsule, repo).distributions
    assert dists["scikit-learn"] == md.version("scikit-learn") and dists["numpy"] == md.version("numpy")
