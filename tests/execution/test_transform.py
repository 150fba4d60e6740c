"""The normal form computes exactly what the source computes (same results, same order of side
effects), and its statement layout is the same on every Python version."""

from __future__ import annotations

import ast
import builtins
import contextlib
import dis
import io
import json
import subprocess
import textwrap
from typing import Any

import pytest

from sojourn.execution import transform as T
from sojourn.execution.checks import instrument
from sojourn.execution.runtime import compile_source
from tests.conftest import SRC, interpreters

CASES = {
    "evaluation order": """
        log = []
        def f(tag, value=0):
            log.append(tag)
            return value
        class Obj:
            count = 0
            def step(self):
                Obj.count += 10
                log.append("step")
                return 1
        o = Obj()
        a = [1, 2, 3]
        x = o.count + o.step() + f("a", 1) * f("b", 2)
        y = a[f("i", 0)] + f("after", 5)
        z = f("fn", len)(f("arg", [1, 2]))
        d = {f("k1", "k"): f("v1", 1), **{f("k2", "j"): 2}}
        s = f"{f('fs1', 1)}-{f('fs2', 2)!r:>4}"
        print(x, y, z, d, s, log)
    """,
    "augmented assignment": """
        class Acc:
            def __init__(self):
                self.v = 1
                self.d = {"k": 1}
            def bump(self):
                self.v += 10
                self.d["k"] += 100
                return 1
        a = Acc()
        a.v += a.bump() + a.bump()
        a.d["k"] += a.bump() * 2
        n = 5
        n *= a.bump() + 1
        lst = [1, 2, 3]
        lst[0:2] += [a.bump()]
        print(a.v, a.d, n, lst)
    """,
    "short circuits and lazy forms": """
        log = []
        def f(v):
            log.append(v)
            return v
        r1 = f(0) and f(1)
        r2 = f(2) if f(0) else f(3)
        r3 = [f(i) for i in range(3) if f(i) > 0]
        r4 = (lambda q: f(q))(7)
        r5 = 1 < f(2) < f(0)
        if (w := f(9)) > 5:
            r6 = w
        print(r1, r2, r3, r4, r5, r6, log)
    """,
    "loops, else, break, continue": """
        out = []
        for i, ch in enumerate("abcdef"):
            if ch == "b":
                continue
            if ch == "e":
                break
            out.append(ch)
        else:
            out.append("no")
        k = 0
        while k < 3:
            k += 1
        else:
            out.append(k)
        for x in []:
            pass
        else:
            out.append("empty")
        print(out)
    """,
    "generators and yield forms": """
        def inner():
            got = yield 1
            print("inner got", got)
            return "ret"
        def outer():
            r = yield from inner()
            print((yield r))
            yield [(yield 7), (yield 8)]
        g = outer()
        print(next(g), g.send("s1"), g.send("s2"), g.send("s3"), g.send("s4"), next(g, None))
    """,
    "scopes": """
        counter = 0
        def outer():
            v = 1
            def inner():
                nonlocal v
                global counter
                v += 1
                counter += 1
                return v
            inner()
            return inner() + counter
        class C:
            '''doc'''
            attr = [i * 2 for i in range(3)]
            def __init__(self):
                self.__private = 5
            def get(self):
                return self.__private
        def documented():
            '''function docstring'''
            return documented.__doc__
        print(outer(), C.__doc__, C.attr, C().get(), documented())
    """,
    "with and try": """
        import contextlib
        @contextlib.contextmanager
        def cm(tag):
            print("enter", tag)
            yield tag
            print("exit", tag)
        with cm("a") as a, cm(a + "b") as b:
            print(a, b)
        try:
            try:
                raise KeyError("k")
            except KeyError:
                raise ValueError("v")
        except ValueError as e:
            print(repr(e), repr(e.__context__))
        finally:
            print("fin")
        try:
            raise ExceptionGroup("g", [ValueError(1), TypeError(2)])
        except* ValueError as eg:
            print("value", eg.exceptions)
        except* TypeError as eg:
            print("type", eg.exceptions)
    """,
    "enumerate and zip in for headers": """
        log = []
        class Seq:
            def __init__(self, n):
                self.n = n
            def __iter__(self):
                log.append(f"iter {self.n}")
                return iter(range(self.n))
        def start():
            log.append("start")
            return 10
        s = 5
        for i, v in enumerate(Seq(3), s):
            log.append((i, v))
        for a, b in zip(Seq(2), Seq(4), strict=False):
            log.append((a, b))
        for i, v in enumerate(Seq(2), start()):
            log.append((i, v))
        pairs = [(a, b) for a, b in zip("ab", Seq(2))]
        print(log, pairs)
    """,
    "match": """
        def m(x):
            match x:
                case {"a": v} if v > 1:
                    return "dict", v
                case [1, *rest]:
                    return "list", rest
                case str() as s:
                    return "str", s
                case _:
                    return "other", x
        print([m(v) for v in ({"a": 2}, {"a": 0}, [1, 2, 3], "s", 5)])
    """,
    "async is left as written": """
        import asyncio
        async def work(n):
            total = 0
            for i in range(n):
                await asyncio.sleep(0)
                total += i
            return total
        print(asyncio.run(work(5)))
    """,
}


def _run(code: object, extra: dict[str, object]) -> str:
    g: dict[str, object] = {"__name__": "__main__", "__builtins__": builtins, **extra}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(code, g)  # type: ignore[arg-type]
    return out.getvalue()


@pytest.mark.parametrize("name", sorted(CASES))
def test_normal_form_computes_the_same(name: str) -> None:
    source = textwrap.dedent(CASES[name])
    plain = _run(compile(source, "case.py", "exec"), {})
    tree, layout, _ = T.normalise(source, "__main__", "case.py")
    instrument(tree)
    ast.fix_missing_locations(tree)
    normal = _run(compile(tree, "case.py", "exec"), {T.FLAG: None, T.ITER: iter, T.OOMTYPES: ()})
    assert normal == plain
    assert not layout.ambiguous


def test_hoisting_keeps_the_last_call_in_place_and_earlier_ones_in_temporaries() -> None:
    tree, layout, _ = T.normalise("x = f() + g(h())\nfor i in gen():\n    pass\n", "m", "m.py")
    text = ast.unparse(tree)
    assert "_sj_t1 = f()" in text and "_sj_t2 = h()" in text and "x = _sj_t1 + g(_sj_t2)" in text
    assert "_sj_it" in text and "__sojourn_iter__" in text
    kinds = sorted(s.kind for s in layout.sites.values())
    assert kinds.count("call") >= 3 and kinds.count("foriter") >= 1


def test_enumerate_and_zip_pass_their_iterables_through_the_iterator_hook() -> None:
    src = "for i, b in enumerate(loader, 1):\n    pass\nfor a, b in zip(xs, ys, strict=True):\n    pass\n"
    text = ast.unparse(T.normalise(src, "m", "m.py")[0])
    assert "= __sojourn_iter__(loader)" in text and "= __sojourn_iter__(xs)" in text and "= __sojourn_iter__(ys)" in text
    # A module that binds the name itself, or an argument that must be evaluated first, keeps
    # the call as written.
    shadowed = ast.unparse(T.normalise("from mytools import enumerate\n" + src, "m", "m.py")[0])
    assert "__sojourn_iter__(loader)" not in shadowed and "__sojourn_iter__(xs)" in shadowed
    later = ast.unparse(T.normalise("for i, b in enumerate(loader, start()):\n    pass\n", "m", "m.py")[0])
    assert "__sojourn_iter__(loader)" not in later


def test_statements_are_guarded_for_out_of_memory_without_an_instruction_more() -> None:
    src = "def f(xs):\n    'doc'\n    t = 0\n    for x in xs:\n        t += x\n    return t\n"
    tree, _, _ = T.normalise(src, "m", "m.py")
    instrument(tree)
    ast.fix_missing_locations(tree)
    ns: dict[str, Any] = {T.FLAG: None, T.ITER: iter, T.OOMTYPES: ()}
    exec(compile(tree, "m.py", "exec"), ns)
    f = ns["f"]
    assert f.__doc__ == "doc"
    text = ast.unparse(tree)
    # t = 0, the iterator's header, the for (its __next__), t += x, return t; not the docstring
    assert text.count(f"except {T.OOMTYPES}:") == 5
    # The guard's try shares its statement's line: no NOP is added.
    assert "NOP" not in [i.opname for i in dis.get_instructions(f)]
    assert f([1, 2, 3]) == 6


def test_checks_go_at_loop_heads_and_entries_of_functions_that_call() -> None:
    src = "def leaf(x):\n    return x * 2\ndef caller(x):\n    '''doc'''\n    y = leaf(x)\n    for i in range(3):\n        y += i\n    return y\n"
    tree, _, _ = T.normalise(src, "m", "m.py")
    instrument(tree)
    text = ast.unparse(tree)
    leaf, caller = text.split("def caller")
    leaf_body = leaf.split("def leaf")[1].split("\nif ")[0]
    assert T.FLAG not in leaf_body
    assert caller.count(T.FLAG) == 2  # entry (after the docstring) + loop head
    assert caller.index("doc") < caller.index(T.FLAG)


def test_layout_is_the_same_on_every_python_version() -> None:
    source = "\n\n".join(textwrap.dedent(v) for v in CASES.values())
    here = T.normalise(source, "m", "m.py")[1].digest
    probe = (
        "import json, sys; sys.path.insert(0, sys.argv[1]);"
        "from sojourn.execution.transform import normalise;"
        "print(json.dumps(normalise(sys.stdin.read(), 'm', 'm.py')[1].digest))"
    )
    checked = 0
    for version, python in sorted(interpreters().items()):
        out = subprocess.run([python, "-c", probe, str(SRC)], input=source, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout) == here, f"layout differs on Python {version}"
        checked += 1
    assert checked >= 1


def test_compiled_form_is_cached_by_source_hash(tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOJOURN_CACHE", str(tmp_path))
    code1, layout1 = compile_source("x = 1\nfor i in range(3):\n    x += i\n", "m", "m.py")
    files = list(tmp_path.iterdir())  # type: ignore[attr-defined]
    assert len(files) == 1
    code2, layout2 = compile_source("x = 1\nfor i in range(3):\n    x += i\n", "m", "m.py")
    assert layout2 == layout1 and code2.co_code == code1.co_code
    compile_source("x = 2\n", "m", "m.py")
    assert len(list(tmp_path.iterdir())) == 2  # type: ignore[attr-defined]


def test_invalid_source_is_reported_as_a_syntax_error() -> None:
    with pytest.raises(SyntaxError, match="not valid Python"):
        T.normalise("def broken(:\n", "m", "m.py")
