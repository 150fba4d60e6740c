"""Fingerprint checks on restore: exact where they can be, canonical where they must be.

Every restore runs in a fresh interpreter. The restore script records which comparison
ran: ``canonical_digests`` is only called when the restored objects did not pickle again
to the captured bytes, and then with ``first`` > 0 when the cheaper comparison, from the
first differing variable on, was enough.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import last_json, run_py

RESTORE = """
import json, sys
import sojourn
from sojourn.capsule import restore as R
from sojourn.errors import IntegrityError

calls = []
_digests = R.canonical_digests
def _spy(stream, segments, hashes, wanted, **kw):
    calls.append(kw.get("first", 0))
    return _digests(stream, segments, hashes, wanted, **kw)
R.canonical_digests = _spy
{patch}
out = {{}}
try:
    ns = sojourn.restore(sys.argv[2], sys.argv[1], into=globals())
except IntegrityError as e:
    out["refused"] = str(e)
else:
{checks}
out["calls"] = calls
print(json.dumps(out))
"""


def capture(tmp_path: Path, repo: str, setup: str, names: str) -> str:
    code = "import sys, sojourn\n" + setup + f"\nref = sojourn.capture({names}, sys.argv[1])\nprint(ref.id)\n"
    return run_py(code, repo, cwd=tmp_path).stdout.split()[-1]


def restore(tmp_path: Path, repo: str, capsule: str, checks: str = "pass", patch: str = "") -> dict:
    body = "\n".join("    " + line for line in checks.strip().splitlines())
    proc = run_py(RESTORE.format(patch=patch, checks=body), repo, capsule, cwd=tmp_path)
    return last_json(proc)  # type: ignore[return-value]


DATACLASS = """
from dataclasses import dataclass, field

@dataclass
class Record:
    id: int
    tag: str
    links: list = field(default_factory=list)

items = [Record(i, f"t{i % 3}", [i, i + 1]) for i in range(50)]
rows = [{"id": i, "tag": "x"} for i in range(50)]
"""


def test_dataclass_of_main_restores_through_the_exact_comparison(tmp_path: Path, repo: str) -> None:
    """The class statement's names (the decorator, ``field``) are not in the namespace that
    is restored; capturing the rebuilt class again must still give the captured bytes."""
    cap = capture(tmp_path, repo, DATACLASS, '{"items": items, "rows": rows}')
    out = restore(tmp_path, repo, cap, """
out["ids"] = [r.id for r in items][:3]
out["links"] = items[4].links
out["is_dataclass"] = __import__("dataclasses").is_dataclass(items[0])
out["same_class"] = all(type(r) is type(items[0]) for r in items)
""")
    assert "refused" not in out, out
    assert out["ids"] == [0, 1, 2] and out["links"] == [4, 5]
    assert out["is_dataclass"] and out["same_class"]
    assert out["calls"] == [], "the restored objects did not pickle again to the captured bytes"


SHARED_KEYS = """
import types

class Plain:
    def __init__(self, i):
        self.id = i
        self.name = f"n{i}"

class Slotted:
    __slots__ = ("id", "__dict__")
    def __init__(self, i):
        self.id = i
        self.score = i / 2

# The same interned strings are attribute names (restored by pickle's BUILD, which interns
# them) and plain dict keys or list items elsewhere.
ns_items = [types.SimpleNamespace(id=i, name="n") for i in range(20)]
plain = [Plain(i) for i in range(20)]
slotted = [Slotted(i) for i in range(5)]
dicts = [{"id": i, "name": "n", "score": 0.5} for i in range(20)]
words = ["id", "name", "score"]
alias = plain[3].__dict__
"""


def test_default_object_state_keeps_string_identity(tmp_path: Path, repo: str) -> None:
    cap = capture(tmp_path, repo, SHARED_KEYS, "globals()")
    out = restore(tmp_path, repo, cap, """
out["ns"] = [ns_items[3].id, ns_items[3].name]
out["plain"] = [plain[7].id, plain[7].name]
out["slotted"] = [slotted[2].id, slotted[2].score]
out["alias"] = alias is plain[3].__dict__
""")
    assert "refused" not in out, out
    assert out["ns"] == [3, "n"] and out["plain"] == [7, "n7"] and out["slotted"] == [2, 1.0]
    assert out["alias"], "an alias of an instance dict must stay one"
    assert out["calls"] == [], "the restored objects did not pickle again to the captured bytes"


# Equal one-character strings that are distinct objects at capture come back as one object
# (the unpickler returns CPython's cached one-character strings), so the stream pickled
# again differs; it differs from the variable ``late`` on only.
SINGLETONS = """
early = [{"k": float(i)} for i in range(2000)]
late = {"keys": [str(i) for i in range(10)], "more": {str(i): i for i in range(10)}}
"""


def test_string_identity_difference_is_compared_from_the_first_differing_variable(tmp_path: Path, repo: str) -> None:
    cap = capture(tmp_path, repo, SINGLETONS, '{"early": early, "late": late}')
    out = restore(tmp_path, repo, cap, """
out["late"] = late
out["n"] = len(early)
""")
    assert "refused" not in out, out
    assert out["late"]["keys"] == [str(i) for i in range(10)] and out["n"] == 2000
    # Two readings (captured and restored stream), both from "late" (index 1), not whole.
    assert out["calls"] == [1, 1], out["calls"]


# Rebuilds each default-state object without its last attribute: a wrong restore.
DROP_ONE = """
import sojourn.capsule.pickler as _p
_real = _p._dict_setstate
def _dropping(obj, state):
    if type(state) is dict and state:
        state = dict(list(state.items())[:-1])
    _real(obj, state)
_p._dict_setstate = _dropping
_check = R.check_fingerprints
def _checking(*a, **k):
    _p._dict_setstate = _real  # only the rebuild is wrong, not the pickling again
    return _check(*a, **k)
R.check_fingerprints = _checking
"""


@pytest.mark.parametrize("setup", [SHARED_KEYS, SINGLETONS + SHARED_KEYS], ids=["exact", "after-a-difference"])
def test_a_wrongly_rebuilt_value_is_refused(tmp_path: Path, repo: str, setup: str) -> None:
    names = "globals()"
    cap = capture(tmp_path, repo, setup, names)
    out = restore(tmp_path, repo, cap, "pass", patch=DROP_ONE)
    assert "refused" in out, out
    assert "fingerprint mismatch after restore for" in out["refused"] and "'plain'" in out["refused"]
    # The partial comparison found it and the whole streams were read to confirm it.
    assert 0 in out["calls"], out["calls"]


def test_a_failed_capture_says_exactly_what_it_left(tmp_path: Path, repo: str) -> None:
    """Arrays are written while later variables are pickled; a capture that then fails
    writes no capsule and says which chunks it left behind."""
    proc = run_py(
        """
import json, sys, threading
import numpy as np
import sojourn
big = np.arange(4 << 20, dtype=np.float64)  # 32 MiB: written while pickling goes on
worker = threading.Thread(target=lambda: None)
try:
    sojourn.capture({"big": big, "worker": worker}, sys.argv[1])
except sojourn.CaptureError as e:
    print(json.dumps({"msg": str(e)}))
""",
        repo,
        cwd=tmp_path,
    )
    msg = last_json(proc)["msg"]  # type: ignore[index]
    assert "no capsule was written" in msg and "8 chunk(s)" in msg and "worker" in msg, msg
    capsules = Path(repo) / "capsules"
    assert not capsules.exists() or not any(capsules.iterdir())
    chunks = [p for p in (Path(repo) / "chunks").rglob("*") if p.is_file()]
    assert len(chunks) == 8, chunks
    # A namespace whose problem comes first writes nothing at all, nor does a small one.
    proc = run_py(
        """
import json, sys, threading
import numpy as np
import sojourn
try:
    sojourn.capture({"worker": threading.Thread(target=lambda: None), "big": np.ones(4 << 20)}, sys.argv[1])
except sojourn.CaptureError as e:
    print(json.dumps({"msg": str(e)}))
try:
    sojourn.capture({"small": np.ones(1000), "worker": threading.Thread(target=lambda: None)}, sys.argv[1])
except sojourn.CaptureError as e:
    print(json.dumps({"msg": str(e)}))
""",
        str(tmp_path / "repo2"),
        cwd=tmp_path,
    )
    msgs = [json.loads(line)["msg"] for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(msgs) == 2 and all("nothing was written" in m for m in msgs), msgs
    assert not [p for p in (tmp_path / "repo2" / "chunks").rglob("*") if p.is_file()]
