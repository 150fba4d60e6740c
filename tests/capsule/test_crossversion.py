"""Capsules move between Python versions (user code travels as source), and a restore warns
precisely when a distribution the capsule used differs in major version or is missing.

The cross-version tests need ``make crossvenvs`` (``.venv3.12`` and ``.venv3.13`` with sojourn
and numpy); they skip cleanly where those interpreters are absent.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import shutil
import textwrap
from pathlib import Path

import pytest

import sojourn
from tests.conftest import last_json, needs_python, run_py

PROGRAM = '''
import functools, enum
from dataclasses import dataclass, field
from typing import NamedTuple
import numpy as np

def make_counter(start):
    n = start
    def inc(by=1):
        nonlocal n
        n += by
        return n
    return inc, (lambda: n)
inc, peek = make_counter(10)
inc(2)
add, mul = (lambda a, b=10: a + b), (lambda a, *, k=3: a * k)
ops = {"neg": lambda v: -v, "sq": lambda v: v ** 2}
fs = [lambda i=i: i * 100 for i in range(3)]
multi = (lambda a,
         b: a - b)

def repeat(n):
    def deco(func):
        @functools.wraps(func)
        def wrapper(*a, **k):
            return [func(*a, **k) for _ in range(n)]
        return wrapper
    return deco

@repeat(2)
def hello(name, *, punct="!"):
    return "hi " + name + punct

@functools.lru_cache(maxsize=None)
def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)

def gen(n):
    for i in range(n):
        yield i * i

class Animal:
    sound = "..."
    def __init__(self, name):
        self.name = name
        self.__secret = name[::-1]
    def speak(self):
        return f"{self.name} says {self.sound}"
    def secret(self):
        return self.__secret
    @classmethod
    def create(cls, name):
        return cls(name)
    @property
    def upper(self):
        return self.name.upper()
    class Tag:
        def show(self):
            return "tag"

class Dog(Animal):
    sound = "woof"
    def speak(self):
        return super().speak() + "!"

@dataclass(order=True)
class Point:
    x: int
    y: int = 0
    tags: list = field(default_factory=list)

class Color(enum.Enum):
    RED = 1
    GREEN = 2

class Pair(NamedTuple):
    left: int
    right: str = "r"

class Slotted:
    __slots__ = ("a", "b")
    def __init__(self, a, b):
        self.a, self.b = a, b

def make_local(k):
    class Local:
        def get(self):
            return k * 2
    return Local()

Animal.sound = "generic"
dog, pt, col, pair, sl, loc = Dog("rex"), Point(3, -4, ["t"]), Color.GREEN, Pair(1), Slotted(1, [2]), make_local(21)
speak = Animal.speak
arr = np.arange(12.0).reshape(3, 4)
view = arr[1:, ::2]
ints = np.array([3, 1, 2], dtype=">i4")
stats = lambda a: [float(a.sum()), a.shape, a.dtype.str]
masked = np.ma.masked_array(arr[0], mask=[0, 1, 0, 0])  # over arr's memory, fill value never set
hardm = np.ma.array([1, 2], mask=[0, 1], hard_mask=True)
'''

RESULTS = '''
def results(g):
    return {
        "closure": [g["inc"](), g["peek"](), g["inc"](5), g["peek"]()],
        "lambdas": [g["add"](1), g["add"](1, 2), g["mul"](2, k=5), g["ops"]["neg"](3), g["ops"]["sq"](4),
                    [f() for f in g["fs"]], g["multi"](5, 2)],
        "decorated": [g["hello"]("bob"), g["hello"].__name__, g["fib"](80), list(g["gen"](5))],
        "classes": [g["dog"].speak(), g["dog"].secret(), g["Animal"].create("cat").speak(), g["dog"].upper,
                    g["Animal"].Tag().show(), repr(g["pt"]), g["pt"] < g["Point"](4), g["col"] is g["Color"].GREEN,
                    repr(g["pair"]), g["sl"].b, g["loc"].get(), g["speak"] is g["Animal"].speak,
                    isinstance(g["dog"], g["Animal"]), type(g["loc"]).__qualname__],
        "numpy": [g["arr"].tolist(), g["view"].tolist(), g["view"].base is g["arr"], g["ints"].dtype.str,
                  g["ints"].tolist(), g["stats"](g["view"])],
        "masked": [g["masked"].data.tolist(), g["masked"].mask.tolist(), g["masked"]._fill_value is None,
                   g["masked"].base.base is g["arr"], g["hardm"].hardmask, g["hardm"].mask.tolist()],
    }
'''


def _capture(tmp_path: Path, repo: str, python: str) -> tuple[str, dict]:
    src = tmp_path / "src"
    src.mkdir()
    proc = run_py(
        "import sys, json, sojourn\n" + PROGRAM + "\nref = sojourn.capture(globals(), sys.argv[1])\n"
        + RESULTS + "\nprint(ref.id)\nprint(json.dumps(results(globals())))\n",
        repo, cwd=src, python=python,
    )
    shutil.rmtree(src)  # the capturing script is gone: only the capsule's source is left
    lines = proc.stdout.splitlines()
    return lines[-2].strip(), json.loads(lines[-1])


def _restore(tmp_path: Path, repo: str, capsule: str, python: str) -> dict:
    dst = tmp_path / "dst"
    dst.mkdir()
    proc = run_py(
        "import sys, json, platform, sojourn\nns = sojourn.restore(sys.argv[2], sys.argv[1])\n" + RESULTS
        + "\nout = results(ns)\nout['python'] = platform.python_version()\nout['notes'] = ns.notes\n"
        "print(json.dumps(out))\n",
        repo, capsule, cwd=dst, python=python,
    )
    return last_json(proc)  # type: ignore[return-value]


@pytest.mark.parametrize(("source", "destination"), [("3.11", "3.12"), ("3.11", "3.13"), ("3.13", "3.11"),
                                                     ("3.12", "3.13")])
def test_capsule_restores_on_another_python(tmp_path: Path, repo: str, source: str, destination: str) -> None:
    py_from, py_to = needs_python(source), needs_python(destination)
    capsule, expected = _capture(tmp_path, repo, py_from)
    out = _restore(tmp_path, repo, capsule, py_to)
    assert out.pop("python").startswith(destination)
    notes = out.pop("notes")
    assert out == expected
    assert any(f"captured on Python {source}" in n and "recompiled from source" in n for n in notes), notes
    report = sojourn.verify(capsule, repo, python=py_to)  # fingerprints hold on the destination too
    assert report.ok, report.error
    assert report.python.startswith(destination)


def _restore_warnings(tmp_path: Path, repo: str, capsule: str) -> list[str]:
    proc = run_py(
        "import sys, json, warnings, sojourn\nwith warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n    ns = sojourn.restore(sys.argv[2], sys.argv[1])\n"
        "print(json.dumps([str(w.message) for w in caught if issubclass(w.category, sojourn.SojournWarning)]))\n",
        repo, capsule, cwd=tmp_path,
    )
    return last_json(proc)  # type: ignore[return-value]


def test_capsule_records_the_distributions_it_references(tmp_path: Path, repo: str) -> None:
    proc = run_py(textwrap.dedent("""
        import sys, sojourn
        import numpy as np, pandas as pd
        from scipy import sparse
        from sklearn.linear_model import Ridge
        mean = np.mean                      # a library function, by reference
        frame_cls = pd.DataFrame            # a library class, by reference
        eye = sparse.eye(3, format="csr")   # a library object
        model = Ridge()
        use_np = lambda v: np.sqrt(v)       # user code referencing a library
        print(sojourn.capture({"mean": mean, "frame_cls": frame_cls, "eye": eye, "model": model,
                               "use_np": use_np}, sys.argv[1]).id)
        """), repo, cwd=tmp_path)
    info = sojourn.inspect(proc.stdout.split()[-1], repo)
    for dist in ("numpy", "pandas", "scipy", "scikit-learn"):
        assert info.distributions.get(dist) == md.version(dist), (dist, info.distributions)
    assert "sojourn" not in info.distributions


def test_mismatched_major_version_warns_precisely(tmp_path: Path, repo: str) -> None:
    # The manifest is signed, so the capturing process itself records the versions we want.
    proc = run_py(textwrap.dedent("""
        import sys, sojourn
        import numpy as np
        from sojourn.capsule import capture as cap
        real = cap.distributions_for
        def faked(modules):
            out = real(modules)
            assert "numpy" in out, out
            out["numpy"] = "0.9.1"
            out["sojourn-test-absent-dist"] = "3.2.0"
            return out
        cap.distributions_for = faked
        arr = np.arange(3)
        print(sojourn.capture({"arr": arr}, sys.argv[1]).id)
        """), repo, cwd=tmp_path)
    capsule = proc.stdout.split()[-1]
    here = md.version("numpy")
    assert _restore_warnings(tmp_path, repo, capsule) == [
        f"numpy 0.9.1 was used at capture, {here} is installed here (major version differs): its objects may "
        "not load or may behave differently",
        "sojourn-test-absent-dist 3.2.0 was used at capture but is not installed here",
    ]
    report = sojourn.verify(capsule, repo)
    assert report.ok, report.error
    assert any("numpy 0.9.1 was used at capture" in n for n in report.notes), report.notes


def test_same_versions_restore_without_warnings(tmp_path: Path, repo: str) -> None:
    proc = run_py("import sys, sojourn\nimport numpy as np\narr = np.arange(3)\n"
                  "print(sojourn.capture({'arr': arr, 'np': np}, sys.argv[1]).id)\n", repo, cwd=tmp_path)
    assert _restore_warnings(tmp_path, repo, proc.stdout.split()[-1]) == []
