"""Round trips of builtins, containers, numpy and user code through a fresh interpreter."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import last_json, run_py

CAPTURE_PRELUDE = """
import sys, json, sojourn
"""


def capture_then_restore(tmp_path: Path, repo: str, setup: str, checks: str) -> dict:
    cap = run_py(
        CAPTURE_PRELUDE + setup + "\nref = sojourn.capture(globals(), sys.argv[1])\nprint(ref.id)\n",
        repo,
        cwd=tmp_path,
    )
    capsule = cap.stdout.split()[-1]
    res = run_py(
        "import sys, json, sojourn\nns = sojourn.restore(sys.argv[2], sys.argv[1], into=globals())\nout = {}\n"
        + checks
        + "\nprint(json.dumps(out))\n",
        repo,
        capsule,
        cwd=tmp_path,
    )
    return last_json(res)  # type: ignore[return-value]


def test_builtins_and_self_references(tmp_path: Path, repo: str) -> None:
    out = capture_then_restore(
        tmp_path,
        repo,
        """
lst = [1, 2.5, "x", None, True, b"b", bytearray(b"ba"), 3 + 4j, range(2, 9, 3), slice(1, 5)]
lst.append(lst)
d = {"a": [1, {"b": (2, 3)}], 5: frozenset({1, 2})}
d["self"] = d
strings = {"alpha", "beta", "gamma", "delta"}
by_name = {s: len(s) for s in ["zeta", "eta", "theta"]}
shared = [1, 2]
pair = (shared, shared)
nested = [[[[[[["deep"]]]]]]]
""",
        """
out["self_list"] = lst[-1] is lst
out["self_dict"] = d["self"] is d
out["set"] = sorted(strings)
out["dict_order"] = list(by_name)
out["shared"] = pair[0] is pair[1] and pair[0] is shared
out["values"] = repr(lst[:-1])
out["deep"] = nested[0][0][0][0][0][0][0]
""",
    )
    assert out["self_list"] and out["self_dict"] and out["shared"]
    assert out["set"] == ["alpha", "beta", "delta", "gamma"]
    assert out["dict_order"] == ["zeta", "eta", "theta"]
    assert out["values"] == repr([1, 2.5, "x", None, True, b"b", bytearray(b"ba"), 3 + 4j, range(2, 9, 3), slice(1, 5)])
    assert out["deep"] == "deep"


def test_numpy_views_keep_sharing_their_base(tmp_path: Path, repo: str) -> None:
    out = capture_then_restore(
        tmp_path,
        repo,
        """
import numpy as np
a = np.arange(20, dtype=np.float64)
b = a[2:5]
rev = a[::-3]
m = np.arange(24, dtype=np.int32).reshape(4, 6)
col = m[:, 2]
fort = np.asfortranarray(np.arange(12.0).reshape(3, 4))
fview = fort[1:, ::2]
struct = np.zeros(4, dtype=[("id", "<i8"), ("pos", "<f4", (3,)), ("name", "U5")])
struct["name"] = ["a", "bb", "ccc", "dddd"]
obj = np.array([1, "two", None, [3]], dtype=object)
obj_view = obj[1:3]
big_endian = np.arange(5, dtype=">i4")
when = np.array(["2024-01-01T10:00", "2025-06-30T23:59"], dtype="datetime64[m]")
empty = np.zeros((0, 3))
scalar0d = np.array(3.5)
flags = np.array([True, False, True])
half = np.arange(6, dtype=np.float16)
cplx = np.arange(4) * (1 + 2j)
""",
        """
import numpy as np
b[0] = 99
out["b_shares"] = bool(a[2] == 99) and b.base is a
rev[0] = -1
out["rev_shares"] = bool(a[19] == -1)
col[:] = 0
out["col_shares"] = int(m[:, 2].sum()) == 0 and not col.flags.c_contiguous
out["fortran"] = bool(fort.flags.f_contiguous)
fview[0, 0] = 1000
out["fview_shares"] = bool(fort[1, 0] == 1000)
out["struct"] = [struct.dtype.descr, struct["name"].tolist()]
obj_view[0] = "changed"
out["obj_shares"] = obj[1] == "changed" and obj[3] == [3]
out["big_endian"] = [big_endian.dtype.str, big_endian.tolist()]
out["when"] = [str(x) for x in when]
out["empty"] = list(empty.shape)
out["scalar0d"] = float(scalar0d)
out["flags"] = flags.tolist()
out["half"] = [half.dtype.str, half.tolist()]
out["cplx"] = repr(cplx)
""",
    )
    assert out["b_shares"] and out["rev_shares"] and out["col_shares"] and out["fview_shares"]
    assert out["fortran"]
    assert out["struct"][1] == ["a", "bb", "ccc", "dddd"]
    assert out["obj_shares"]
    assert out["big_endian"] == [">i4", [0, 1, 2, 3, 4]]
    assert out["when"] == ["2024-01-01T10:00", "2025-06-30T23:59"]
    assert out["empty"] == [0, 3] and out["scalar0d"] == 3.5
    assert out["flags"] == [True, False, True] and out["half"][0] == "<f2"


def test_random_state_continues(tmp_path: Path, repo: str) -> None:
    cap = run_py(
        """
import sys, random, json
import numpy as np
import sojourn
random.seed(11); np.random.seed(12)
random.random(); np.random.rand()
g = np.random.default_rng(5); g.normal(size=3)
legacy = np.random.RandomState(9); legacy.rand()
own = random.Random(4); own.random()
ref = sojourn.capture(globals(), sys.argv[1])
print(ref.id)
print(json.dumps([random.random(), float(np.random.rand()), float(g.random()), float(legacy.rand()), own.random()]))
""",
        repo,
        cwd=tmp_path,
    )
    capsule, expected = cap.stdout.split("\n")[:2]
    res = run_py(
        """
import sys, random, json
import numpy as np
import sojourn
ns = sojourn.restore(sys.argv[2], sys.argv[1])
print(json.dumps([random.random(), float(np.random.rand()), float(ns["g"].random()), float(ns["legacy"].rand()), ns["own"].random()]))
""",
        repo,
        capsule,
        cwd=tmp_path,
    )
    assert res.stdout.strip() == expected


def test_verify_in_fresh_interpreter(tmp_path: Path, repo: str) -> None:
    import sojourn

    ref = sojourn.capture({"x": [1, 2, 3], "y": {"k": "v"}}, repo)
    report = sojourn.verify(ref.id, repo)
    assert report.ok, report.error
    assert {v["name"] for v in report.variables} >= {"x", "y"}
