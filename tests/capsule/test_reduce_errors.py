"""Bad input at capture names the variable: an object whose own pickling raises (its
``__reduce__``, ``__reduce_ex__`` or ``__getstate__``) or hands pickle something it cannot use
is reported by its path from the namespace, with its reason, and nothing is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_py

CLASSES = """
import collections
class RaisingReduce:
    def __reduce__(self):
        raise RuntimeError("the connection pool cannot be pickled")
class RaisingReduceEx:
    def __reduce_ex__(self, protocol):
        raise RuntimeError("no reduce_ex for you")
class RaisingState:
    def __getstate__(self):
        raise KeyError("missing weights")
class SlotsState:
    __slots__ = ("a",)
    def __getstate__(self):
        raise TypeError("slot state refused")
class NotATuple:
    def __reduce__(self):
        return 42
class ShortTuple:
    def __reduce__(self):
        return (print,)
class NotCallable:
    def __reduce__(self):
        return ("print", ())
class Trainer:
    def __init__(self):
        self.loader = {"workers": [1, RaisingState()]}
"""

CASES = [
    ("RaisingReduce()", "model", "model (__main__.RaisingReduce)", "the connection pool cannot be pickled"),
    ("RaisingReduceEx()", "model", "model (__main__.RaisingReduceEx)", "no reduce_ex for you"),
    ("RaisingState()", "cfg", "cfg (__main__.RaisingState)", "'missing weights'"),
    ("SlotsState()", "cfg", "cfg (__main__.SlotsState)", "slot state refused"),
    ("Trainer()", "trainer", "trainer.loader['workers'][1] (__main__.RaisingState)", "'missing weights'"),
    ("[0, NotATuple()]", "items", "items[1] (__main__.NotATuple)", "its __reduce__ returned int, not a tuple"),
    ("{'k': ShortTuple()}", "opts", "opts['k'] (__main__.ShortTuple)", "1 items, not 2 to 6"),
    ("NotCallable()", "thing", "thing (__main__.NotCallable)", "its first item, a str, is not callable"),
]


@pytest.mark.parametrize(("expr", "name", "path", "reason"), CASES, ids=[c[0] for c in CASES])
def test_an_object_whose_pickling_fails_is_named_by_its_path(tmp_path: Path, expr: str, name: str, path: str,
                                                              reason: str) -> None:
    proc = run_py(
        CLASSES + f"""
import json, sys, sojourn
{name} = {expr}
fine = list(range(10))
try:
    sojourn.capture({{"fine": fine, "{name}": {name}}}, sys.argv[1])
except sojourn.CaptureError as e:
    print(json.dumps({{"message": str(e), "paths": [p.path for p in e.problems]}}))
""",
        str(tmp_path / "repo"), cwd=tmp_path,
    )
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["paths"] == [path.split(" (")[0]], out
    assert f"  - {path}: " in out["message"] and reason in out["message"], out["message"]
    assert "nothing was written" in out["message"]
    assert not list((tmp_path / "repo" / "capsules").glob("*.json"))
