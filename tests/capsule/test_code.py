"""User code travels as source: functions, lambdas, closures, decorators and classes are
captured in one process and rebuilt in a fresh one, after the capturing script is deleted
(as on another machine). Every capsule is also checked by ``sojourn.verify`` (a third
interpreter that restores into a fresh namespace and compares fingerprints)."""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pytest

import sojourn
from tests.conftest import last_json, run_py

RESTORE = """
import sys, json, warnings, sojourn
from sojourn.errors import SojournWarning
with warnings.catch_warnings(record=True) as _caught:
    warnings.simplefilter("always")
    ns = sojourn.restore(sys.argv[2], sys.argv[1], into=globals(), files_to=sys.argv[3])
out = {"warnings": [str(w.message) for w in _caught if issubclass(w.category, SojournWarning)]}
"""


def capture(tmp_path: Path, repo: str, setup: str, *, capture: str = "globals()", files: dict[str, str] | None = None,
            capture_files: bool = False, delete: bool = True) -> str:
    """Run ``setup`` in a fresh interpreter in ``tmp_path/src``, capture, delete the sources."""
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    for name, text in (files or {}).items():
        (src / name).write_text(textwrap.dedent(text))
    files_arg = ", files=sys.argv[2]" if capture_files else ""
    lines = textwrap.dedent(setup).splitlines(keepends=True)
    futures = "".join(ln for ln in lines if ln.startswith("from __future__"))
    proc = run_py(
        futures + "import sys, json, sojourn\n" + "".join(ln for ln in lines if not ln.startswith("from __future__"))
        + f"\nref = sojourn.capture({capture}, sys.argv[1]{files_arg})\nprint(ref.id)\n",
        repo, str(src), cwd=src,
    )
    if delete:
        shutil.rmtree(src)
    return proc.stdout.split()[-1]


def restore(tmp_path: Path, repo: str, capsule: str, checks: str, *, verify: bool = True, where: str = "dst") -> dict:
    if verify:
        report = sojourn.verify(capsule, repo)
        assert report.ok, report.error
    dst = tmp_path / where
    dst.mkdir(exist_ok=True)
    proc = run_py(RESTORE + textwrap.dedent(checks) + "\nprint(json.dumps(out))\n", repo, capsule, str(dst / "files"), cwd=dst)
    return last_json(proc)  # type: ignore[return-value]


def roundtrip(tmp_path: Path, repo: str, setup: str, checks: str, **kw: object) -> dict:
    out = restore(tmp_path, repo, capture(tmp_path, repo, setup, **kw), checks)  # type: ignore[arg-type]
    assert out["warnings"] == [], out["warnings"]
    return out


def test_closures_share_cells_and_nonlocal_writes(tmp_path: Path, repo: str) -> None:
    out = roundtrip(tmp_path, repo, """
        def make_counter(start):
            n = start
            def inc(by=1):
                nonlocal n
                n += by
                return n
            def get():
                return n
            return inc, get
        inc, get = make_counter(10)
        inc(); inc(5)
        other_inc, other_get = make_counter(0)
        def outer():
            data = []
            def push(v):
                data.append(v)
                return len(data)
            return push, (lambda: list(data))
        push, peek = outer()
        push("a")
        """, """
        out["values"] = [get(), inc(), get(), inc(4), get(), other_get(), other_inc(), get()]
        out["cells"] = [inc.__closure__[0] is get.__closure__[0], inc.__closure__[0] is not other_get.__closure__[0]]
        out["list"] = [push("b"), peek(), push.__closure__[0] is peek.__closure__[0]]
        out["names"] = [inc.__qualname__, peek.__qualname__]
        """)
    assert out["values"] == [16, 17, 17, 21, 21, 0, 1, 21]
    assert out["cells"] == [True, True]
    assert out["list"] == [2, ["a", "b"], True]
    assert out["names"] == ["make_counter.<locals>.inc", "outer.<locals>.<lambda>"]


def test_lambdas(tmp_path: Path, repo: str) -> None:
    out = roundtrip(tmp_path, repo, '''
        add, mul = (lambda a, b=10: a + b), (lambda a, *, k=3: a * k)
        ops = {"neg": lambda v: -v, "sq": lambda v: v ** 2}
        table = [lambda: "first", (lambda x: x, lambda x: x * 2)]
        fs = [lambda i=i: i * 100 for i in range(3)]
        curry = lambda x: lambda y: x + y
        multi = (lambda a,
                 b: a
                 - b)
        text_fn = lambda: """line1
            indented"""
        key = sorted(["bb", "a", "ccc"], key=lambda s: -len(s))
        ''', """
        out["v"] = [add(1), add(1, 2), mul(2), mul(2, k=5), ops["neg"](3), ops["sq"](3), table[0](),
                    table[1][0](7), table[1][1](7), [f() for f in fs], curry(1)(2), multi(5, 2), text_fn(), key]
        out["defaults"] = [add.__defaults__, mul.__kwdefaults__, fs[2].__defaults__]
        """)
    assert out["v"] == [11, 3, 6, 10, -3, 9, "first", 7, 14, [0, 100, 200], 3, 3, "line1\n    indented",
                        ["ccc", "bb", "a"]]
    assert out["defaults"] == [[10], {"k": 3}, [2]]


def test_decorators(tmp_path: Path, repo: str) -> None:
    out = roundtrip(tmp_path, repo, """
        import functools

        def loud(func):
            @functools.wraps(func)
            def wrapper(*a, **k):
                return str(func(*a, **k)).upper()
            return wrapper

        def repeat(n):
            def deco(func):
                @functools.wraps(func)
                def wrapper(*a, **k):
                    return [func(*a, **k) for _ in range(n)]
                return wrapper
            return deco

        def plain(func):  # no functools.wraps
            def inner(x):
                return func(x) + 1
            return inner

        @loud
        def greet(name, *, punct="!"):
            "Says hello."
            return "hi " + name + punct

        @repeat(3)
        def tick(v):
            return v

        @plain
        def base(x):
            return x * 10

        @functools.lru_cache(maxsize=32)
        def fib(n):
            return n if n < 2 else fib(n - 1) + fib(n - 2)
        fib(25)

        greet_q = functools.partial(greet, punct="?")
        """, """
        out["v"] = [greet("bob"), greet.__name__, greet.__doc__, greet.__wrapped__("al"), tick(2), base(1),
                    greet_q("x"), fib(60), fib.cache_parameters(), fib.__wrapped__.__name__]
        out["names"] = [tick.__qualname__, base.__qualname__, greet.__wrapped__.__qualname__]
        """)
    assert out["v"] == ["HI BOB!", "greet", "Says hello.", "hi al!", [2, 2, 2], 11, "HI X?", 1548008755920,
                        {"maxsize": 32, "typed": False}, "fib"]
    assert out["names"] == ["tick", "plain.<locals>.inner", "greet"]


def test_defaults_annotations_attributes(tmp_path: Path, repo: str) -> None:
    out = roundtrip(tmp_path, repo, """
        SENTINEL = object()
        def f(a, b=[1, 2], *args, c=SENTINEL, d: int = 4, **kw) -> str:
            "doc of f"
            return repr((a, b, args, c is SENTINEL, d, sorted(kw)))
        f.tag = {"k": 1}
        def no_doc():
            return 1
        no_doc.__doc__ = None
        async def fetch(x):
            return x * 2
        def gen(n):
            total = 0
            for i in range(n):
                total += yield i * i
        """, """
        import asyncio
        g = gen(3); first = next(g)
        out["v"] = [f(1), f(1, [0], 5, c=None, z=1), f.tag, f.__doc__, f.__annotations__["d"].__name__,
                    f.__kwdefaults__["c"] is SENTINEL, no_doc.__doc__, asyncio.run(fetch(21)),
                    [first, g.send(1), g.send(2)]]
        """)
    assert out["v"] == ["(1, [1, 2], (), True, 4, [])", "(1, [0], (5,), False, 4, ['z'])", {"k": 1}, "doc of f",
                        "int", True, None, 42, [0, 1, 4]]


def test_globals_keep_their_captured_values_and_stay_live(tmp_path: Path, repo: str) -> None:
    cap = capture(tmp_path, repo, """
        LIMIT = 5
        def capped(v):
            return min(v, LIMIT)
        def use_later():
            return DEFINED_AFTER_CAPTURE
        snapshot = sojourn.capture(globals(), sys.argv[1]).id
        LIMIT = 100  # changed after the snapshot was taken
        """, capture="{'capped': capped, 'snapshot': snapshot}")
    out = restore(tmp_path, repo, cap, """
        out["outer"] = capped(7)  # this capsule was taken after LIMIT changed
        first = {}
        sojourn.restore(snapshot, sys.argv[1], into=first)
        out["captured"] = first["capped"](7)
        first["LIMIT"] = 2  # the restored function reads the namespace it was restored into
        out["live"] = first["capped"](7)
        first["DEFINED_AFTER_CAPTURE"] = "late"
        out["late"] = first["use_later"]()
        """)
    assert out == {"warnings": [], "outer": 7, "captured": 5, "live": 2, "late": "late"}


def test_recursion(tmp_path: Path, repo: str) -> None:
    out = roundtrip(tmp_path, repo, """
        def fact(n):
            return 1 if n <= 1 else n * fact(n - 1)
        def even(n):
            return True if n == 0 else odd(n - 1)
        def odd(n):
            return False if n == 0 else even(n - 1)
        def outer():
            def rec(n):
                return 0 if n == 0 else n + rec(n - 1)
            return rec
        rec = outer()
        def tree(depth):
            return [] if depth == 0 else [tree(depth - 1), tree(depth - 1)]
        """, """
        out["v"] = [fact(10), even(10), odd(7), rec(100), str(tree(2)), rec.__code__.co_freevars]
        """)
    assert out["v"] == [3628800, True, True, 5050, "[[[], []], [[], []]]", ["rec"]]


def test_classes_and_instances(tmp_path: Path, repo: str) -> None:
    out = roundtrip(tmp_path, repo, """
        import abc, enum
        from dataclasses import dataclass, field
        from typing import NamedTuple

        class Meta(type):
            def __new__(mcs, name, bases, ns):
                cls = super().__new__(mcs, name, bases, ns)
                cls.made_by = mcs.__name__
                return cls

        class Shape(abc.ABC):
            __slots__ = ()
            @abc.abstractmethod
            def area(self): ...

        class Animal(metaclass=Meta):
            sound = "..."
            count = 0
            legs: int = 4
            def __init__(self, name):
                self.name = name
                self.__secret = name[::-1]
                Animal.count += 1
            def speak(self):
                return f"{self.name} says {self.sound}"
            def secret(self):
                return self.__secret
            @staticmethod
            def kind():
                return "animal"
            @classmethod
            def create(cls, name):
                return cls(name)
            @property
            def upper(self):
                return self.name.upper()
            class Tag:
                label = "tag"
                def show(self):
                    return "Tag:" + self.label

        class Dog(Animal):
            sound = "woof"
            def speak(self):
                return super().speak() + "!"

        class Square(Shape):
            __slots__ = ("side", "__weakref__")
            def __init__(self, side):
                self.side = side
            def area(self):
                return self.side ** 2

        @dataclass(order=True)
        class Point:
            x: int
            y: int = 0
            tags: list = field(default_factory=list)
            def norm1(self):
                return abs(self.x) + abs(self.y)

        class Color(enum.Enum):
            RED = 1
            GREEN = enum.auto()

        class Level(enum.IntEnum):
            LOW = 1
            HIGH = 2

        class Pair(NamedTuple):
            left: int
            right: str = "r"

        def shout(self):
            return self.speak().upper()

        Animal.sound = "generic"      # class attributes changed after definition
        Animal.shout = shout           # a method added after definition
        Animal.extra = staticmethod(lambda: "patched")
        dog, cat = Dog("rex"), Animal.create("cat")
        tag, sq, pt, col, lvl, pair = Animal.Tag(), Square(3), Point(3, -4, ["t"]), Color.GREEN, Level.HIGH, Pair(1)
        """, """
        out["animal"] = [dog.speak(), cat.speak(), dog.secret(), Animal.kind(), Dog.create("x").speak(), dog.upper,
                         tag.show(), Animal.extra(), dog.shout(), Animal.count, Dog.made_by, Animal.legs]
        out["isinstance"] = [isinstance(dog, Animal), isinstance(dog, Dog), type(tag) is Animal.Tag,
                             isinstance(sq, Shape), isinstance(pt, Point), isinstance(col, Color),
                             isinstance(pair, Pair), isinstance(pair, tuple), issubclass(Dog, Animal)]
        out["others"] = [sq.area(), not hasattr(sq, "__dict__"), repr(pt), pt.norm1(), pt < Point(4), col is Color.GREEN,
                         col.value, Color(1).name, lvl > Level.LOW, repr(pair), pair._replace(left=5).left,
                         Pair._fields, Animal.__qualname__, Animal.Tag.show.__qualname__]
        try:
            Shape()
        except TypeError:
            out["abstract"] = True
        """)
    assert out["animal"] == ["rex says woof!", "cat says generic", "xer", "animal", "x says woof!", "REX",
                             "Tag:tag", "patched", "REX SAYS WOOF!", 3, "Meta", 4]
    assert all(out["isinstance"]), out["isinstance"]
    assert out["others"] == [9, True, "Point(x=3, y=-4, tags=['t'])", 7, True, True, 2, "RED", True,
                             "Pair(left=1, right='r')", 5, ["left", "right"], "Animal", "Animal.Tag.show"]
    assert out["abstract"]


def test_methods_keep_their_identity(tmp_path: Path, repo: str) -> None:
    out = roundtrip(tmp_path, repo, """
        class C:
            key = lambda self: self.v
            def __init__(self, v):
                self.v = v
            def method(self):
                return self.v
            @staticmethod
            def sm():
                return "static"
            @classmethod
            def cm(cls):
                return cls.__name__
            class Inner:
                def hi(self):
                    return "inner"
        obj = C(7)
        f = C.method
        bound = obj.method
        s = C.sm
        cm = C.cm
        k = C.key
        inner_cls = C.Inner
        inner_hi = C.Inner.hi
        """, """
        out["v"] = [f is C.method, bound.__self__ is obj, bound.__func__ is C.method, bound(), s is C.sm, s(),
                    cm.__self__ is C, cm(), k is C.key, k(obj), inner_cls is C.Inner, inner_hi is C.Inner.hi]
        """)
    assert out["v"] == [True, True, True, 7, True, "static", True, "C", True, 7, True, True]


def test_class_whose_methods_are_wrapped_by_library_decorators(tmp_path: Path, repo: str) -> None:
    """A library decorator's wrapper carries the library's globals; the class must still be
    rebuilt in the user's namespace."""
    out = roundtrip(tmp_path, repo, """
        import contextlib, functools
        PREFIX = "res:"
        class Resource:
            @contextlib.contextmanager
            def opened(self):
                yield PREFIX + "open"
            @functools.cached_property
            def size(self):
                return len(PREFIX)
            def plain(self):
                return PREFIX
        r = Resource()
        """, """
        with r.opened() as v:
            out["v"] = [v, r.size, r.plain(), Resource.plain.__globals__ is globals()]
        """)
    assert out["v"] == ["res:open", 4, "res:", True]


def test_classes_defined_inside_functions(tmp_path: Path, repo: str) -> None:
    out = roundtrip(tmp_path, repo, """
        def make(start):
            step = 2
            class Counter:
                total = 0
                def __init__(self):
                    self.v = start
                def bump(self):
                    nonlocal step
                    self.v += step
                    step += 1
                    Counter.total += 1
                    return self.v
                def same(self):
                    return type(self) is Counter
                def __repr__(self):
                    return f"Counter({self.v})"
            def peek_step():
                return step
            return Counter, peek_step
        Counter, peek_step = make(10)
        c1 = Counter(); c1.bump()
        Counter2, peek2 = make(100)
        c2 = Counter2()
        def registry():
            class Base:
                subclasses = []
                def __init_subclass__(cls, **kw):
                    super().__init_subclass__(**kw)
                    Base.subclasses.append(cls.__name__)
            class Sub(Base):
                pass
            return Base, Sub
        Base, Sub = registry()
        """, """
        out["v"] = [c1.v, c1.bump(), peek_step(), c1.bump(), isinstance(c1, Counter), c1.same(), Counter.total,
                    Counter.__qualname__, repr(c2), peek2(), isinstance(c2, Counter), type(c2) is Counter2,
                    Base.subclasses, issubclass(Sub, Base)]
        """)
    assert out["v"] == [12, 15, 4, 19, True, True, 3, "make.<locals>.Counter", "Counter(100)", 2, False, True,
                        ["Sub"], True]


def test_base_class_state_listing_subclasses_runs_each_class_statement_once(tmp_path: Path, repo: str) -> None:
    out = roundtrip(tmp_path, repo, """
        class Plugin:
            registry = []
            def __init_subclass__(cls, **kw):
                super().__init_subclass__(**kw)
                Plugin.registry.append(cls)
        class A(Plugin): pass
        class B(Plugin): pass
        """, """
        out["v"] = [[c.__name__ for c in Plugin.registry], Plugin.registry[0] is A, Plugin.registry[1] is B]
        """, capture="{'A': A, 'B': B, 'Plugin': Plugin}")
    assert out["v"] == [["A", "B"], True, True]


def test_private_names_stay_mangled(tmp_path: Path, repo: str) -> None:
    out = roundtrip(tmp_path, repo, """
        class Vault:
            def __init__(self):
                self.__n = 0
            def opener(self):
                self.__n += 1
                return lambda: self.__n
            def nested(self):
                def inner():
                    return self.__n * 10
                return inner
        v = Vault()
        peek = v.opener()
        times_ten = v.nested()
        reach = lambda obj: obj._Vault__n
        """, """
        out["v"] = [peek(), times_ten(), reach(v), v.opener()(), peek(), times_ten()]
        """, capture="{'v': v, 'peek': peek, 'times_ten': times_ten, 'reach': reach}")
    assert out["v"] == [1, 10, 1, 2, 2, 20]


def test_namespace_that_is_not_the_script_globals(tmp_path: Path, repo: str) -> None:
    out = roundtrip(tmp_path, repo, """
        SCALE = 3
        UNUSED = __import__("threading").Lock()  # never referenced: must not be captured
        def helper(v):
            return v * SCALE
        def uses_helper(v):
            return helper(v) + 1
        class Box:
            def __init__(self, v):
                self.v = v
            def scaled(self):
                return helper(self.v)
        box = Box(4)
        square = lambda v: v * v
        """, """
        out["v"] = [uses_helper(2), box.scaled(), square(5), isinstance(box, Box), sorted(ns)]
        g = uses_helper.__globals__
        out["globals"] = [g["helper"].__globals__ is g, type(box).scaled.__globals__ is g, "UNUSED" in g]
        """, capture="{'uses_helper': uses_helper, 'box': box, 'square': square, 'Box': Box}")
    assert out["v"] == [7, 12, 25, True, ["Box", "box", "square", "uses_helper"]]
    assert out["globals"] == [True, True, False]


MYLIB = """
import functools
RATE = 2
class Thing:
    def __init__(self, v):
        self.v = v
    def double(self):
        return self.v * RATE
def scale(v):
    return v * RATE
shift = lambda v: v + 100
def make_adder(n):
    def add(v):
        return v + n
    return add
@functools.lru_cache(maxsize=8)
def sq(v):
    return v * v
"""

MYLIB_SETUP = """
import mylib
from mylib import Thing, scale, sq
t = Thing(3)
add5 = mylib.make_adder(5)
sh = mylib.shift
"""

MYLIB_CHECKS = """
import mylib
out["v"] = [t.double(), scale(2), add5(1), sh(1), sq(4)]
out["ids"] = [isinstance(t, mylib.Thing), Thing is mylib.Thing, scale is mylib.scale, sq is mylib.sq, mylib is ns["mylib"]]
out["file"] = mylib.__file__
"""


def test_workspace_module_comes_from_the_restored_files(tmp_path: Path, repo: str) -> None:
    cap = capture(tmp_path, repo, MYLIB_SETUP, files={"mylib.py": MYLIB}, capture_files=True)
    out = restore(tmp_path, repo, cap, MYLIB_CHECKS)
    assert out["v"] == [6, 4, 6, 101, 16]
    assert all(out["ids"]), out["ids"]
    assert out["file"] == str(tmp_path / "dst" / "files" / "mylib.py")
    assert out["warnings"] == []
    info = sojourn.inspect(cap, repo)
    assert "mylib" in info.user_modules


def test_workspace_module_is_rebuilt_when_its_file_is_gone(tmp_path: Path, repo: str) -> None:
    cap = capture(tmp_path, repo, MYLIB_SETUP, files={"mylib.py": MYLIB})  # the files are not captured
    out = restore(tmp_path, repo, cap, MYLIB_CHECKS)
    assert out["v"] == [6, 4, 6, 101, 16]
    assert all(out["ids"]), out["ids"]
    assert out["warnings"] == ["module 'mylib' was rebuilt from the source recorded in the capsule because it "
                               "cannot be imported here"]
    # The rebuilt module's code can be captured again, and restored where the module is gone too.
    again = 'out["again"] = sojourn.capture({"t": t, "sh": sh, "add5": add5, "mylib": mylib}, sys.argv[1]).id\n'
    out2 = restore(tmp_path, repo, cap, again + MYLIB_CHECKS.replace("import mylib", ""), where="dst2")
    out3 = restore(tmp_path, repo, out2["again"], 'import mylib\nout["v"] = [t.double(), sh(1), add5(2), isinstance(t, mylib.Thing)]', where="dst3")
    assert out3["v"] == [6, 101, 7, True]


def test_workspace_module_that_differs_is_rebuilt_with_a_warning(tmp_path: Path, repo: str) -> None:
    cap = capture(tmp_path, repo, MYLIB_SETUP, files={"mylib.py": MYLIB})
    (tmp_path / "dst").mkdir()
    (tmp_path / "dst" / "mylib.py").write_text(MYLIB.replace("RATE = 2", "RATE = 7"))
    out = restore(tmp_path, repo, cap, MYLIB_CHECKS)
    assert out["v"] == [6, 4, 6, 101, 16]
    assert len(out["warnings"]) == 1 and "differs from the captured source" in out["warnings"][0]


def test_future_annotations_are_kept(tmp_path: Path, repo: str) -> None:
    out = roundtrip(tmp_path, repo, """
        from __future__ import annotations
        from dataclasses import dataclass
        def f(x: NotDefinedAnywhere) -> AlsoMissing:
            return x
        @dataclass
        class Node:
            value: int
            next: Node | None = None
        chain = Node(1, Node(2))
        """, """
        out["v"] = [f.__annotations__, Node.__annotations__, chain.next.value, f(3)]
        """)
    assert out["v"] == [{"x": "NotDefinedAnywhere", "return": "AlsoMissing"}, {"value": "int", "next": "Node | None"}, 2, 3]


def test_recapture_of_restored_code_is_a_fixpoint(tmp_path: Path, repo: str) -> None:
    cap = capture(tmp_path, repo, """
        import functools
        from dataclasses import dataclass
        def make(n):
            def add(v):
                return v + n
            return add
        add3 = make(3)
        lam = lambda x, y=2: x ** y
        @dataclass
        class P:
            x: int
            def twice(self):
                return P(self.x * 2)
        p = P(4)
        m = P.twice
        def local():
            class L:
                def hi(self):
                    return "L"
            return L()
        inst = local()
        """)
    proc = run_py("""
import sys, json, sojourn
fresh = {}
sojourn.restore(sys.argv[2], sys.argv[1], into=fresh)
again = sojourn.capture(fresh, sys.argv[1])
add7 = fresh["make"](7)  # code created after the restore is found again too
third = sojourn.capture({"add7": add7, "inst": fresh["inst"]}, sys.argv[1]).id
print(json.dumps({"again": again.id, "third": third, "fps": {v.name: v.fingerprint for v in again.variables}}))
""", repo, cap, cwd=tmp_path)
    out = last_json(proc)
    assert isinstance(out, dict)
    first = {v.name: v.fingerprint for v in sojourn.inspect(cap, repo).variables}
    assert first == out["fps"]  # byte for byte: the restored objects pickle exactly as the originals
    for capsule in (out["again"], out["third"]):
        report = sojourn.verify(capsule, repo)
        assert report.ok, report.error
    out3 = restore(tmp_path, repo, out["third"], 'out["v"] = [add7(1), inst.hi(), type(inst).__qualname__]', where="dst3")
    assert out3["v"] == [8, "L", "local.<locals>.L"]


def _problems(tmp_path: Path, repo: str, setup: str, capture_expr: str) -> list[str]:
    proc = run_py(
        "import sys, json, sojourn\n" + textwrap.dedent(setup)
        + f"\ntry:\n    sojourn.capture({capture_expr}, sys.argv[1])\n"
        "except sojourn.CaptureError as e:\n    print(json.dumps([str(p) for p in e.problems]))\n",
        repo, cwd=tmp_path,
    )
    return last_json(proc)  # type: ignore[return-value]


def test_code_without_source_is_refused_precisely(tmp_path: Path, repo: str) -> None:
    problems = _problems(tmp_path, repo, """
        exec("def made(x):\\n    return x + 1\\nclass Made:\\n    def m(self):\\n        return 1\\n")
        def make(n):
            class K:
                size = n * 2
            return K
        K = make(3)
        holder = {"deep": [made]}
        """, "{'holder': holder, 'Made': Made, 'inst': Made(), 'K': K}")
    assert len(problems) == 3, problems
    text = "\n".join(problems)
    assert "holder['deep'][0]" in text and "function made was created by exec() or compile() from a string (<string> line 1)" in text
    # A class no class statement made travels by value (code_library); its method has no source.
    assert "function Made.m was created by exec() or compile() from a string (<string> line 4)" in text
    assert "class make.<locals>.K uses 'n' of the function that defines it when the class is created" in text


def test_file_edited_after_loading_is_refused(tmp_path: Path, repo: str) -> None:
    problems = _problems(tmp_path, repo, """
        def edited(v):
            return v * 2
        class Edited:
            def m(self):
                return 1
        me = open(__file__).read()
        open(__file__, "w").write(me.replace("v * 2", "v * 3").replace("return 1", "return 2"))
        import linecache; linecache.checkcache()
        """, "{'edited': edited, 'Edited': Edited}")
    assert len(problems) == 2, problems
    for p in problems:
        assert "no longer matches the running code: the file was edited after it was loaded" in p


def test_registries_filled_by_class_statements_are_not_filled_twice(tmp_path: Path, repo: str) -> None:
    """Class statements run again on restore (metaclasses, __init_subclass__); what they
    write into class attributes the capsule already restored is not kept."""
    out = roundtrip(tmp_path, repo, """
        class Meta(type):
            names = []
            def __new__(mcs, name, bases, ns):
                mcs.names.append(name)
                return super().__new__(mcs, name, bases, ns)
        class A(metaclass=Meta):
            pass
        class Base:
            subclasses = []
            def __init_subclass__(cls, **kw):
                super().__init_subclass__(**kw)
                Base.subclasses.append(cls.__name__)
        class Sub(Base):
            pass
        """, """
        out["v"] = [Meta.names, Base.subclasses, type(A) is Meta]
        """)
    assert out["v"] == [["A"], ["Sub"], True]


def test_decorator_side_effect_on_a_captured_global_is_refused(tmp_path: Path, repo: str) -> None:
    """A decorator that appends to a global list the capsule also holds runs again on
    restore; the restore is refused by the fingerprint check rather than return the
    longer list."""
    cap = capture(tmp_path, repo, """
        REGISTRY = []
        def register(cls):
            REGISTRY.append(cls.__name__)
            return cls
        @register
        class A:
            pass
        """)
    report = sojourn.verify(cap, repo)
    assert not report.ok
    assert "fingerprint mismatch after restore for 'REGISTRY'" in (report.error or "")


@pytest.mark.parametrize("kind", ["function", "class"])
def test_scaffold_compiles_at_original_line_numbers(tmp_path: Path, repo: str, kind: str) -> None:
    """Tracebacks of rebuilt code point at the user's original lines."""
    out = roundtrip(tmp_path, repo, """
        import traceback
        class Holder:
            def method(self):
                def boom():
                    raise ValueError("x")
                return boom
        boom = Holder().method()
        """, f"""
        import traceback
        try:
            {"boom()" if kind == "function" else "Holder().method()()"}
        except ValueError as e:
            out["line"] = traceback.extract_tb(e.__traceback__)[-1].lineno
        """)
    assert out["line"] == 7  # the "raise" line of the capturing script (after its 1-line prelude)


def test_capsule_json_lists_user_module_sources(tmp_path: Path, repo: str) -> None:
    cap = capture(tmp_path, repo, MYLIB_SETUP, files={"mylib.py": MYLIB})
    info = sojourn.inspect(cap, repo)
    assert set(info.user_modules) == {"mylib"}
    assert json.dumps(info.to_json())
