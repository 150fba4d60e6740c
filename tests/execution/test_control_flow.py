"""Pauses inside functions at any depth, loops, branches, try/except/finally, with blocks,
match, closures and comprehensions: every chain prints exactly what an unpaused run prints
(so no completed statement ran twice and none was skipped)."""

from __future__ import annotations

import pytest

from tests.execution.conftest import EXIT_PAUSED, Runner

DEPTH = """
def step(state, k):
    total = 0
    for j in range(3):
        total += j * k
        kill_here(f"s{len(state)}-{j}")
    state.append(total)
    print("step", k, total, flush=True)
    return total

def train(epochs):
    state = []
    acc = 0
    for e in range(epochs):
        for k in range(4):
            acc += step(state, k)
        print("epoch", e, acc, flush=True)
    return acc, state

def main():
    acc, state = train(3)
    print("final", acc, state)

main()
"""


@pytest.mark.parametrize("kills", ["s0-0", "s1-2,s5-1,s10-2", "s0-0,s0-1,s0-2,s1-0"])
def test_pause_inside_nested_calls(runner: Runner, kills: str) -> None:
    script = runner.write("depth.py", DEPTH)
    chain = runner.chain(script, kills=kills)
    runner.same_as_plain(script, chain)
    assert len(chain.segments) == len(kills.split(",")) + 1
    assert any("in train -> " in s.stderr and s.stderr.count(" in step") for s in chain.segments)


LOOPS = """
words = ["alpha", "beta", "gamma", "delta"]
table = {w: len(w) for w in words}
out = []
for n, (w, size) in enumerate(zip(words, table.values())):
    for ch in w:
        kill_here(f"{w}-{ch}")
        if ch == "a":
            continue
        if ch == "t":
            break
        out.append(ch)
    else:
        out.append("|")
    print(n, w, size, "".join(out), flush=True)
k = 0
while k < 6:
    k += 1
    kill_here(f"while{k}")
    if k == 9:
        break
else:
    print("while else", k, flush=True)
for key, value in table.items():
    kill_here(f"item-{key}")
    print(key, value, flush=True)
it = iter(range(10))
for a in it:
    kill_here(f"shared-{a}")
    b = next(it)
    print("pair", a, b, flush=True)
print("done", out)
"""


def test_pause_inside_loops_keeps_the_same_iterator(runner: Runner) -> None:
    script = runner.write("loops.py", LOOPS)
    chain = runner.chain(script, kills="alpha-l,beta-e,delta-d,while3,while6,item-gamma,shared-4")
    runner.same_as_plain(script, chain)
    assert len(chain.segments) == 8


BRANCHES = """
def classify(n):
    if n % 3 == 0:
        for i in range(2):
            kill_here(f"if{n}-{i}")
        return "fizz"
    elif n % 3 == 1:
        for i in range(2):
            kill_here(f"elif{n}-{i}")
        return "one"
    else:
        for i in range(2):
            kill_here(f"else{n}-{i}")
        return "two"

def risky(n):
    log = []
    try:
        for i in range(2):
            kill_here(f"try{n}-{i}")
        if n % 2:
            raise ValueError(n)
        log.append("even")
    except ValueError as e:
        for i in range(2):
            kill_here(f"exc{n}-{i}")
        log.append(f"odd {e}")
        try:
            raise
        except ValueError as again:
            log.append(f"again {again.args}")
    except KeyError:
        log.append("never")
    else:
        for i in range(2):
            kill_here(f"else{n}-{i}")
        log.append("else")
    finally:
        log.append("finally")
    return log

for n in range(6):
    print(n, classify(n), risky(n), flush=True)
"""


def test_pause_in_branches_handlers_and_else(runner: Runner) -> None:
    script = runner.write("branches.py", BRANCHES)
    kills = "if0-0,elif1-1,else2-0,try3-1,exc3-0,exc5-1,else4-1"
    chain = runner.chain(script, kills=kills)
    runner.same_as_plain(script, chain)
    assert len(chain.segments) >= 5
    assert any("in risky" in s.stderr for s in chain.segments)


def test_partially_evaluated_expression_is_not_evaluated_again(runner: Runner) -> None:
    script = runner.write("expr.py", """
        calls = []
        def f():
            calls.append("f")
            print("f called", flush=True)
            return 10
        def work(tag):
            for i in range(2):
                kill_here(f"{tag}{i}")
        def g():
            calls.append("g")
            work("g")
            print("g body", flush=True)
            return 5
        class Box:
            def __init__(self):
                self.count = 1
            def bump(self):
                self.count += 100
                work("bump")
                return 1
        x = f() + g()
        box = Box()
        y = box.count + box.bump()
        print(x, y, box.count, calls)
    """)
    chain = runner.chain(script, kills="g0,bump1")
    runner.same_as_plain(script, chain)
    assert chain.stdout.count("f called") == 1
    assert len(chain.segments) == 3


def test_comprehension_defers_the_pause_to_its_statement(runner: Runner) -> None:
    script = runner.write("comp.py", """
        def slow(v):
            for i in range(3):
                kill_here(f"c{v}-{i}")
            return v * v
        squares = [slow(v) for v in range(4)]
        print("squares", squares, flush=True)
        total = sum(slow(v) for v in range(3))
        print("total", total, flush=True)
        for i in range(3):
            print("after", i, flush=True)
    """)
    chain = runner.chain(script, kills="c1-0,c0-2")
    runner.same_as_plain(script, chain)
    assert "comprehension is running" in chain.segments[0].stderr or "inside an expression" in chain.segments[0].stderr, chain.describe()
    # The pause landed once the comprehension's statement was done, not inside it: the
    # resumed process starts with the statement after it.
    assert chain.segments[0].stdout == ""
    assert chain.segments[1].stdout.startswith("squares")


def test_match_statement_and_closures(runner: Runner) -> None:
    script = runner.write("match.py", """
        def make_counter(start):
            count = start
            def bump(by):
                nonlocal count
                for i in range(2):
                    kill_here(f"bump{count}-{i}")
                count += by
                return count
            return bump

        def describe(item):
            match item:
                case {"kind": "point", "x": x, "y": y}:
                    for i in range(2):
                        kill_here(f"point{x}-{i}")
                    return f"point {x},{y}"
                case [first, *rest]:
                    for i in range(2):
                        kill_here(f"list{first}-{i}")
                    return f"list {first} +{len(rest)}"
                case _:
                    return "other"

        counter = make_counter(10)
        for item in [{"kind": "point", "x": 1, "y": 2}, [7, 8, 9], 3]:
            print(describe(item), counter(5), flush=True)
        print("final", counter(1))
    """)
    chain = runner.chain(script, kills="point1-1,list7-0,bump15-1,bump20-0")
    runner.same_as_plain(script, chain)
    assert len(chain.segments) == 5


def test_closure_made_before_the_pause_shares_its_variable_after(runner: Runner) -> None:
    script = runner.write("cells.py", """
        def outer():
            level = 1
            def read():
                return level
            for i in range(3):
                kill_here(f"o{i}")
                level += 10
                print(i, level, read(), flush=True)
            return read
        r = outer()
        print("after", r())
    """)
    chain = runner.chain(script, kills="o1")
    runner.same_as_plain(script, chain)


def test_methods_private_names_and_super(runner: Runner) -> None:
    script = runner.write("methods.py", """
        class Base:
            def __init__(self, n):
                self.__secret = n
                self.items = []
            def total(self):
                return sum(self.items) + self.__secret

        class Model(Base):
            def __init__(self, n):
                super().__init__(n)
                for i in range(3):
                    kill_here(f"init{i}")
                    self.items.append(i)
            def run(self, steps):
                for s in range(steps):
                    kill_here(f"run{s}")
                    self.items.append(super().total())
                return self.total()

        m = Model(5)
        print("built", m.items, flush=True)
        print("ran", m.run(4), isinstance(m, Model), type(m).__name__)
    """)
    chain = runner.chain(script, kills="init1,run2")
    runner.same_as_plain(script, chain)
    assert len(chain.segments) == 3


def test_pause_in_a_loop_at_module_level_inside_if_main(runner: Runner) -> None:
    script = runner.write("ifmain.py", """
        import sys
        def helper(x):
            return x + 1
        if __name__ == "__main__":
            values = []
            for i in range(5):
                kill_here(i)
                values.append(helper(i))
                print(i, values, flush=True)
            print("argv", sys.argv[1:])
    """)
    chain = runner.chain(script, "--flag", "7", kills="1,3")
    runner.same_as_plain(script, chain, "--flag", "7")
    assert chain.segments[-1].stdout.strip().endswith("argv ['--flag', '7']")


def test_script_exit_code_and_exception_propagate(runner: Runner) -> None:
    script = runner.write("fail.py", """
        import sys
        for i in range(3):
            kill_here(i)
            print(i, flush=True)
        if len(sys.argv) > 1:
            raise ValueError("boom")
        sys.exit(3)
    """)
    chain = runner.chain(script, kills="1")
    assert [s.returncode for s in chain.segments] == [EXIT_PAUSED, 3]
    chain = runner.chain(script, "x", kills="1")
    assert chain.segments[-1].returncode == 1
    assert "ValueError: boom" in chain.segments[-1].stderr
    assert "fail.py" in chain.segments[-1].stderr


def test_class_defined_under_if_main_keeps_its_pause_points(runner: Runner) -> None:
    script = runner.write("ifclass.py", """
        if __name__ == "__main__":
            class Point:
                hits = 0
                def __init__(self, x):
                    self.x = x
                def twice(self, tag):
                    total = 0
                    for i in range(2):
                        kill_here(f"{tag}-{i}")
                        total += self.x
                    Point.hits += 1
                    return total
            p = Point(3)
            for n in range(4):
                print(n, p.twice(n), Point.hits, type(p) is Point, flush=True)
    """)
    chain = runner.chain(script, kills="1-0,2-0")
    runner.same_as_plain(script, chain)
    assert [s.returncode for s in chain.segments] == [EXIT_PAUSED, EXIT_PAUSED, 0]
    assert all("in Point.twice" in s.stderr for s in chain.segments[:2])
