"""User generators: paused while running (on the stack) or while suspended (held in a
variable), defined at module level or inside functions, driven by for, next() and send(),
delegating with yield from; the generator carries on where it was after the resume."""

from __future__ import annotations

from tests.execution.conftest import EXIT_PAUSED, Runner

GENERATORS = """
def numbers(n):
    total = 0
    for i in range(n):
        kill_here(f"gen{i}")
        total += i
        got = yield i * i
        if got is not None:
            total += got
            print("gen got", got, "total", total, flush=True)
    print("gen finished", total, flush=True)
    return total

def consumer():
    side = numbers(4)
    first = next(side)
    out = []
    for sq in numbers(5):
        out.append(sq)
        kill_here(f"loop{sq}")
        print("sq", sq, flush=True)
    print("side sends", side.send(100), first, flush=True)
    print("side next", next(side), flush=True)
    print(out, flush=True)

consumer()
"""


def test_generator_paused_while_running_and_while_suspended(runner: Runner) -> None:
    script = runner.write("gens.py", GENERATORS)
    # gen2: inside the generator driven by the for loop (running, on the stack); loop4: in the
    # consumer, with `side` suspended at its yield, later resumed by send().
    chain = runner.chain(script, kills="gen2,loop4,gen3")
    runner.same_as_plain(script, chain)
    assert len(chain.segments) == 4
    assert any("in numbers" in s.stderr for s in chain.segments)


def test_generator_defined_inside_a_function(runner: Runner) -> None:
    script = runner.write("inner.py", """
        def make(scale):
            offset = 1000
            def scaled(values):
                for v in values:
                    kill_here(f"in{v}")
                    yield v * scale + offset
            return scaled

        def pipeline(data):
            gen = make(3)(data)
            held = make(5)([1, 2, 3])
            first = next(held)
            results = []
            for x in gen:
                kill_here(f"out{x}")
                results.append(x)
            results.append(first)
            results.extend(held)
            return results

        print(pipeline([1, 2, 3, 4]))
    """)
    chain = runner.chain(script, kills="in2,out1009,in4")
    runner.same_as_plain(script, chain)
    assert len(chain.segments) == 4


def test_yield_from_running_and_suspended(runner: Runner) -> None:
    script = runner.write("yf.py", """
        def leaf(tag, n):
            for i in range(n):
                kill_here(f"{tag}{i}")
                got = yield f"{tag}{i}"
                if got:
                    print("leaf got", got, flush=True)
            return f"{tag} done"

        def middle():
            r1 = yield from leaf("a", 3)
            print("middle r1", r1, flush=True)
            r2 = yield from leaf("b", 2)
            yield from ["x", "y"]
            return (r1, r2)

        def top():
            result = yield from middle()
            print("top result", result, flush=True)

        held = top()
        print("first", next(held), flush=True)
        for i in range(3):
            kill_here(f"outer{i}")
            print("loop", i, flush=True)
        print("sent", held.send("hello"), flush=True)
        for item in held:
            kill_here(f"item-{item}")
            print("item", item, flush=True)
    """)
    # outer1: `held` suspended inside two levels of yield from; a1/b0: paused inside the leaf
    # while the whole delegation chain is running; item-x: suspended inside `yield from list`.
    chain = runner.chain(script, kills="outer1,a2,b1,item-x")
    runner.same_as_plain(script, chain)
    assert len(chain.segments) == 5


def test_generator_expression_and_library_generator_are_refused_precisely(runner: Runner) -> None:
    script = runner.write("genexpr.py", """
        import itertools
        squares = (i * i for i in range(10))
        print(next(squares), flush=True)
        for i in range(3):
            kill_here(i)
            print("loop", i, flush=True)
        print(list(squares))
    """)
    chain = runner.chain(script, kills="1")
    assert [s.returncode for s in chain.segments] == [0]  # refused: the program went on to its end
    runner.same_as_plain(script, chain)
    err = chain.segments[0].stderr
    assert "pause refused" in err and "squares" in err and "generator expression" in err


def test_generator_created_but_not_started(runner: Runner) -> None:
    script = runner.write("fresh.py", """
        def count(start, *, step=1):
            n = start
            while True:
                yield n
                n += step
        later = count(10, step=5)
        for i in range(3):
            kill_here(i)
            print(i, flush=True)
        print([next(later) for _ in range(3)])
    """)
    chain = runner.chain(script, kills="0,1")
    assert [s.returncode for s in chain.segments] == [EXIT_PAUSED, EXIT_PAUSED, 0]
    runner.same_as_plain(script, chain)
