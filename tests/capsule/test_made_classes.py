"""What cloudpickle's suite found missing (issue 11), each checked by a restore in a fresh
interpreter of every Python version at hand (3.11, 3.12, 3.13; absent ones skip): classes no
class statement made, the singletons' types, descriptors, views, proxies, weak references,
TypeVars, abstract classes' registrations, paths across pathlib's move to pathlib._local,
a variable name UTF-8 cannot spell, the methods a dataclass generated, structures nested
deeper than the stack; and what no serializer can carry, refused by path.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import interpreters, last_json, run_py

PROGRAM = '''
import abc, collections, dataclasses, enum, pathlib, types, typing, weakref

P = collections.namedtuple("P", "a b", defaults=[2])
N = typing.NamedTuple("N", [("x", int), ("y", str)])
Color = enum.IntEnum("Color", {"RED": 1, "GREEN": 2})
Mode = enum.Enum("Mode", "READ WRITE")
D = dataclasses.make_dataclass("D", [("x", int), ("y", int, dataclasses.field(default=3))], frozen=True)
Dyn = abc.ABCMeta("Dyn", (abc.ABC,), {"k": 1, "__doc__": "made by a call"})
Dyn.register(list)
Plain = type("Plain", (), {"twice": lambda self, v: 2 * v})
Plain.again = Plain

class Base(abc.ABC):
    @abc.abstractmethod
    def m(self): ...
Base.register(tuple)

class Prop:
    _v = 1
    @property
    def v(self):
        return self._v
    @v.setter
    def v(self, value):
        self._v = value

def local_classes():
    T = typing.TypeVar("T")
    slots = ("a",)
    class Box(typing.Generic[T]):
        pass
    class Slotted:
        __slots__ = slots
    @dataclasses.dataclass(order=True)
    class LPt:
        x: int
        y: int = 0
    return T, Box, Slotted, LPt
T, Box, Slotted, LPt = local_classes()
generated = [LPt.__init__, LPt.__repr__, LPt.__lt__]  # made by dataclass from strings
sl = Slotted(); sl.a = 5

class Member:
    pass
m1, m2 = Member(), Member()
members = weakref.WeakSet([m1, m2])
held = weakref.ref(m1)
d = {"a": 1}
views = [d.keys(), d.values(), d.items(), types.MappingProxyType(d), collections.OrderedDict(z=1).keys()]
prop = Prop(); prop.v = 7
builtin = [type(None), type(Ellipsis), type(NotImplemented), float.real, int.__add__, types.MappingProxyType]
mv = memoryview(b"Hello!" * 3)[2:15:2]
paths = [pathlib.Path("/x/y"), pathlib.PurePosixPath("a/b"), pathlib.PosixPath]
values = [P(1), N(1, "s"), Color.GREEN, Mode.WRITE, D(1)]
globals()["name\\udc80"] = "a surrogate in a name"

def scope():
    import xml.etree.ElementTree  # a submodule reached through the closure's `xml`
    def comment():
        return xml.etree.ElementTree.Comment("c").text
    return comment
comment = scope()
'''

RESULTS = '''
def results(g):
    d = g["d"]
    d["b"] = 2  # the views and the proxy are of the restored dict itself
    P, N, Color, Mode, D = g["P"], g["N"], g["Color"], g["Mode"], g["D"]
    p, n, green, write, dd = g["values"]
    return {
        "made": [repr(p), repr(P(5)), isinstance(p, P), repr(n), N._fields, green is Color.GREEN, int(green),
                 write is Mode.WRITE, repr(dd), repr(D(2)), g["Dyn"].k, g["Dyn"].__doc__,
                 issubclass(list, g["Dyn"]), g["Plain"]().twice(4), g["Plain"].again is g["Plain"]],
        "abc": [issubclass(tuple, g["Base"]), issubclass(dict, g["Base"])],
        "property": [g["prop"].v, type(g["prop"]).v.fset is not None],
        "local": [repr(g["T"]), g["Box"].__parameters__[0] is g["T"], g["sl"].a, g["Slotted"].__slots__],
        "generated": [g["generated"][0] is g["LPt"].__init__, g["generated"][1](g["LPt"](3)),
                      g["generated"][2](g["LPt"](1), g["LPt"](2))],
        "weak": [len(g["members"]), set(g["members"]) == {g["m1"], g["m2"]}, g["held"]() is g["m1"]],
        "views": [list(g["views"][0]), list(g["views"][1]), list(g["views"][2]), dict(g["views"][3]),
                  type(g["views"][4]).__name__],
        "builtin": [repr(t) for t in g["builtin"]],
        "memoryview": g["mv"].tobytes().decode(),
        "paths": [str(g["paths"][0]), str(g["paths"][1]), g["paths"][2].__name__,
                  type(g["paths"][0]).__name__],
        "surrogate": g["name\\udc80"],
        "submodule": g["comment"](),
    }
'''


def _capture(cwd: Path, repo: str, python: str) -> tuple[str, dict]:
    proc = run_py("import sys, json, sojourn\n" + PROGRAM + RESULTS
                  + "\nns = {k: v for k, v in globals().items() if not k.startswith('__') and k not in ('sys', 'json', "
                  "'sojourn', 'results')}\nref = sojourn.capture(ns, sys.argv[1])\n"
                  "print(ref.id)\nprint(json.dumps(results(dict(ns))))\n", repo, cwd=cwd, python=python)
    lines = proc.stdout.splitlines()
    return lines[-2].strip(), json.loads(lines[-1])


def _restore(cwd: Path, repo: str, capsule: str, python: str) -> dict:
    proc = run_py("import sys, json, sojourn\nns = sojourn.restore(sys.argv[2], sys.argv[1])\n" + RESULTS
                  + "\nprint(json.dumps(results(ns)))\n", repo, capsule, cwd=cwd, python=python)
    return last_json(proc)  # type: ignore[return-value]


@pytest.mark.parametrize("source", ["3.11", "3.13"])
def test_classes_made_by_calls_and_library_objects_travel_to_every_version(tmp_path: Path, repo: str,
                                                                           source: str) -> None:
    found = interpreters()
    if source not in found:
        pytest.skip(f"Python {source} is not available (make crossvenvs creates .venv{source})")
    src = tmp_path / "src"
    src.mkdir()
    capsule, expected = _capture(src, repo, found[source])
    shutil.rmtree(src)
    assert expected["abc"] == [True, False] and expected["weak"] == [2, True, True]
    dst = tmp_path / "dst"
    dst.mkdir()
    for version, python in sorted(found.items()):
        out = _restore(dst, repo, capsule, python)
        assert out == expected, f"restored on {version}"


def test_what_no_serializer_can_carry_is_refused_by_path(tmp_path: Path, repo: str) -> None:
    proc = run_py('''
import sys, json, hashlib, types, weakref, sojourn
class Gone:
    pass
g = Gone(); dead = weakref.ref(g); del g
mod = types.ModuleType("made_here")
exec("x = 1", mod.__dict__)
buf = bytearray(b"abc")
state = {"hash": [hashlib.sha256(b"x")], "dead": dead, "mod": mod, "view": memoryview(buf)}
try:
    sojourn.capture({"state": state, "buf": buf}, sys.argv[1])
except sojourn.CaptureError as e:
    print(json.dumps(sorted(str(p) for p in e.problems)))
''', repo, cwd=tmp_path)
    problems = last_json(proc)
    assert isinstance(problems, list) and len(problems) == 4, problems
    text = "\n".join(problems)
    assert "state['hash'][0] (_hashlib.HASH): a hash object's running state lives inside OpenSSL" in text
    assert "state['dead'] (weakref.ReferenceType): a weak reference to an object that no longer exists" in text
    assert "state['mod'] (builtins.module): module 'made_here' was made at run time" in text
    assert "state['view'] (builtins.memoryview): a memoryview of a bytearray shares that object's memory" in text


def test_library_namedtuple_rows_travel(tmp_path: Path, repo: str) -> None:
    pytest.importorskip("pandas")
    proc = run_py('''
import sys, sojourn, pandas as pd
df = pd.DataFrame({"a": [1, 2], "b": ["x", "y"]})
rows = list(df.itertuples())
print(sojourn.capture({"rows": rows}, sys.argv[1]).id)
''', repo, cwd=tmp_path)
    capsule = proc.stdout.split()[-1]
    out = last_json(run_py('''
import sys, json, sojourn
rows = sojourn.restore(sys.argv[2], sys.argv[1])["rows"]
print(json.dumps([type(rows[0]).__name__, rows[1].b, rows[1].Index, type(rows[0]) is type(rows[1])]))
''', repo, capsule, cwd=tmp_path))
    assert out == ["Pandas", "y", 1, True]


def test_deeply_nested_structures_travel_to_every_version(tmp_path: Path, repo: str) -> None:
    """20 000 levels: past 3.11's recursion limit and the C recursion limit 3.12 and 3.13 keep
    (no setting raises it). Capture and the restore's check pickle such a graph again on a
    thread with a big stack, with pickle's Python pickler (issue 11; corpus finding C2)."""
    proc = run_py('''
import sys, sojourn
class Node:
    def __init__(self, nxt):
        self.nxt = nxt
head = None
for _ in range(20000):
    head = Node(head)
nested = []
for _ in range(20000):
    nested = [nested]
print(sojourn.capture({"head": head, "nested": nested, "small": [1, 2]}, sys.argv[1]).id)
''', repo, cwd=tmp_path)
    capsule = proc.stdout.split()[-1]
    for version, python in sorted(interpreters().items()):
        out = last_json(run_py('''
import sys, json, sojourn
ns = sojourn.restore(sys.argv[2], sys.argv[1])
n, node = 0, ns["head"]
while node is not None:
    n, node = n + 1, node.nxt
m, x = 0, ns["nested"]
while x:
    m, x = m + 1, x[0]
print(json.dumps([n, m, ns["small"], sys.getrecursionlimit()]))
''', repo, capsule, cwd=tmp_path, python=python))
        assert out == [20000, 20000, [1, 2], 1000], f"restored on {version}"  # the limit is put back
