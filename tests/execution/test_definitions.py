"""How the program's functions and classes come back on resume (docs/execution.md, "What runs
again on resume"): no definition statement of the main script runs again; its functions and
classes come back from the capsule with the state they had."""

from __future__ import annotations

import pytest

from tests.execution.conftest import EXIT_PAUSED, Runner, other_pythons


def test_a_default_from_a_global_keeps_the_value_its_def_gave_it(runner: Runner) -> None:
    # The def is not evaluated again (SCALE's assignment does not run again either), and the
    # default is the one the def made, not SCALE's value at the pause.
    script = runner.write("defaults.py", """
        SCALE = 3
        def f(x, k=SCALE):
            return x * k
        def g(*, k=SCALE * 2):
            return k
        SCALE = 5
        total = 0
        for i in range(4):
            kill_here(i)
            total += f(i)
            print(i, total, f.__defaults__, g(), SCALE, flush=True)
    """)
    chain = runner.chain(script, kills="1,2")
    assert [s.returncode for s in chain.segments] == [EXIT_PAUSED, EXIT_PAUSED, 0], chain.describe()
    runner.same_as_plain(script, chain)
    assert chain.stdout.splitlines()[-1] == "3 18 (3,) 6 5"


def test_decorators_do_not_run_again_and_wrappers_registries_and_attributes_travel(runner: Runner) -> None:
    script = runner.write("decorated.py", """
        import functools
        LIMIT = 8
        REGISTRY = {}
        CALLS = []
        def register(fn):
            if fn.__name__ in REGISTRY:
                raise RuntimeError("registered twice: " + fn.__name__)
            REGISTRY[fn.__name__] = fn
            return fn
        def traced(label):
            def deco(fn):
                @functools.wraps(fn)
                def wrapper(*args):
                    CALLS.append(label + fn.__name__)
                    return fn(*args)
                return wrapper
            return deco
        @register
        def double(x):
            return 2 * x
        @traced(f"L{LIMIT}:")
        def triple(x):
            return 3 * x
        @functools.lru_cache(maxsize=LIMIT)
        def fib(n):
            return n if n < 2 else fib(n - 1) + fib(n - 2)
        if LIMIT > 4:
            def pick():
                return "big"
        else:
            def pick():
                return "small"
        double.calls = 0
        LIMIT = 99
        del register, traced
        for i in range(4):
            kill_here(i)
            double.calls += 1
            print(i, REGISTRY["double"](i), REGISTRY["double"] is double, triple(i), triple.__wrapped__(i),
                  fib(20 + i), fib.cache_parameters()["maxsize"], double.calls, pick(), CALLS[-1], flush=True)
        print(sorted(REGISTRY), len(CALLS))
    """)
    chain = runner.chain(script, kills="1,2")
    assert [s.returncode for s in chain.segments] == [EXIT_PAUSED, EXIT_PAUSED, 0], chain.describe()
    runner.same_as_plain(script, chain)
    assert "3 6 True 9 9 28657 8 4 big L8:triple" in chain.stdout


def test_classes_are_made_again_with_the_values_their_statement_read(runner: Runner) -> None:
    # The class statement runs again (its methods keep their pause points), with the names it
    # reads at their values at capture; data attributes and the defaults its functions were
    # made with are set back; decorators and __init_subclass__ that register the class do
    # not register it twice.
    script = runner.write("classes.py", """
        from dataclasses import dataclass, field
        SIZE = 10
        UNIT = "m"
        KINDS = []
        def kind(cls):
            if cls in KINDS or any(k.__name__ == cls.__name__ for k in KINDS):
                raise RuntimeError("registered twice")
            KINDS.append(cls)
            return cls
        class Base:
            subclasses = []
            def __init_subclass__(cls, **kw):
                super().__init_subclass__(**kw)
                Base.subclasses.append(cls.__name__)
        @kind
        @dataclass
        class Box(Base):
            size: int = SIZE
            tags: list = field(default_factory=list)
            label = UNIT * 2
            count = 0
            def grow(self, by=SIZE):
                for i in range(2):
                    kill_here(f"grow{self.size}-{i}")
                self.size += by
                return self.size
            @staticmethod
            def unit(u=UNIT):
                return u
        SIZE = 1000
        UNIT = "km"
        grow = Box.grow
        b = Box()
        for i in range(3):
            kill_here(i)
            Box.count += 1
            print(i, b.grow(), Box().size, Box.label, Box.unit(), Box.count, isinstance(b, Box), type(b) is Box,
                  KINDS[0] is Box, Box.grow is grow, Base.subclasses, flush=True)
    """)
    chain = runner.chain(script, kills="1,grow30-0")
    assert [s.returncode for s in chain.segments] == [EXIT_PAUSED, EXIT_PAUSED, 0], chain.describe()
    runner.same_as_plain(script, chain)
    assert chain.stdout.splitlines()[-1] == "2 40 10 mm m 3 True True True True ['Box']"


def test_definitions_travel_across_python_versions(runner: Runner) -> None:
    pythons = other_pythons()
    if len(pythons) < 2:
        pytest.skip("needs a second Python version (.venv3.12 or .venv3.13)")
    script = runner.write("versions.py", """
        import functools
        SCALE = 3
        HANDLERS = {}
        def handler(fn):
            HANDLERS[fn.__name__] = fn
            return fn
        @handler
        def f(x, k=SCALE):
            return x * k
        class Acc:
            start = SCALE
            def add(self, x, k=SCALE):
                self.start += f(x) * k
                return self.start
        SCALE = 7
        acc = Acc()
        for i in range(4):
            kill_here(i)
            print(i, HANDLERS["f"](i), acc.add(i), Acc.start, flush=True)
    """)
    chain = runner.chain(script, kills="1,2", pythons=[pythons[0], pythons[-1], pythons[0]])
    assert len(chain.segments) == 3, chain.describe()
    runner.same_as_plain(script, chain)


def test_a_function_paused_deep_in_its_own_recursion_calls_itself_again_after_resume(runner: Runner) -> None:
    # Its resume copies are compiled inside a scaffold function; the name it calls itself by
    # must stay the module's global, not become an unbound variable of the scaffold.
    pythons = other_pythons()
    script = runner.write("recurse.py", """
        def walk(n, path):
            total = 0
            for k in range(2):
                if n == 0:
                    kill_here(path + str(k))
                    total += 1
                else:
                    total += walk(n - 1, path + str(k))
            return total
        print(walk(3, ""), flush=True)
    """)
    chain = runner.chain(script, kills="0000,0110", pythons=[pythons[0], pythons[-1], pythons[0]])
    assert [s.returncode for s in chain.segments] == [EXIT_PAUSED, EXIT_PAUSED, 0], chain.describe()
    runner.same_as_plain(script, chain)
    assert chain.stdout == "16\n"


def test_abstract_classes_keep_their_registrations_and_class_kinds_travel(runner: Runner) -> None:
    script = runner.write("kinds.py", """
        import abc, dataclasses, enum, functools, typing
        class Color(enum.Enum):
            RED = 1
            BLUE = 2
        class Pt(typing.NamedTuple):
            x: int
            y: int = 0
        @dataclasses.dataclass(frozen=True)
        class Frozen:
            v: int = 3
        class Temp:
            def __init__(self):
                self._c = 0
            @property
            def c(self):
                return self._c
            @c.setter
            def c(self, v):
                self._c = v
            @functools.cached_property
            def heavy(self):
                return self._c * 100
        class Base(abc.ABC):
            @abc.abstractmethod
            def run(self): ...
        class Impl(Base):
            def run(self):
                return "ran"
        Base.register(tuple)
        t = Temp()
        t.c = 4
        held = [Color.RED, Pt(1), Frozen(), Impl()]
        for i in range(3):
            kill_here(i)
            t.c += 1
            print(i, held[0] is Color.RED, Color(2), Pt(2, 3), Frozen(), t.c, t.heavy, held[3].run(),
                  isinstance(held[3], Base), issubclass(tuple, Base), isinstance((), Base), flush=True)
    """)
    chain = runner.chain(script, kills="1", pythons=[other_pythons()[0], other_pythons()[-1]])
    assert [s.returncode for s in chain.segments] == [EXIT_PAUSED, 0], chain.describe()
    runner.same_as_plain(script, chain)
    assert chain.stdout.splitlines()[-1].endswith("True True True")
