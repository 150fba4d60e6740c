"""The rules written down in docs/execution.md, one test each: what runs again on resume, what
does not, and where a pause waits."""

from __future__ import annotations

from tests.execution.conftest import EXIT_PAUSED, Runner


def test_top_level_imports_before_the_pause_run_again(runner: Runner) -> None:
    runner.write("noisy.py", """
        print("importing noisy", flush=True)
        value = 41
    """, prelude=False)
    runner.write("lib/tools/__init__.py", "", prelude=False)
    runner.write("lib/tools/extra.py", "def more(x):\n    return x * 100\n", prelude=False)
    script = runner.write("main.py", """
        import os, sys
        import noisy
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
        import tools.extra
        def helper():
            return noisy.value + 1
        print("top-level statement", flush=True)
        for i in range(3):
            kill_here(i)
            noisy.value += 1
            print(i, helper(), tools.extra.more(i), flush=True)
    """)
    chain = runner.chain(script, kills="1")
    assert [s.returncode for s in chain.segments] == [EXIT_PAUSED, 0], chain.describe()
    # The import ran again in the new process (its print shows), but the module's state is the
    # captured one, and the other top-level statement did not run again. The folder the
    # program put on sys.path is there again (the statement that put it there does not run
    # again), so its import and the submodule it imported are too.
    assert chain.segments[1].stdout.splitlines()[0] == "importing noisy"
    assert chain.stdout.count("top-level statement") == 1
    ref = runner.plain(script)
    assert chain.segments[0].stdout + chain.segments[1].stdout.removeprefix("importing noisy\n") == ref.stdout


def test_a_paused_call_is_re_entered_not_called_again(runner: Runner) -> None:
    script = runner.write("reenter.py", """
        calls = {"lookup": 0}
        def step(n):
            for i in range(2):
                kill_here(f"step{n}-{i}")
            handlers["step"] = None  # the callee changes what its own call expression names
            return n * 10
        class Table(dict):
            def __getitem__(self, key):
                calls["lookup"] += 1
                return super().__getitem__(key)
        handlers = Table(step=step)
        result = handlers["step"](3) + 1
        print(result, calls)
    """)
    chain = runner.chain(script, kills="step3-0")
    runner.same_as_plain(script, chain)
    assert chain.stdout.strip() == "31 {'lookup': 1}"


def test_f_plus_g_paused_in_g_reads_f_from_its_temporary(runner: Runner) -> None:
    script = runner.write("fg.py", """
        count = 0
        def f():
            global count
            count += 1
            return 100
        def g():
            for i in range(2):
                kill_here(f"g{i}")
            return 5
        x = f() + g()
        print(x, count)
    """)
    chain = runner.chain(script, kills="g0")
    assert len(chain.segments) == 2
    runner.same_as_plain(script, chain)
    assert chain.stdout.strip() == "105 1"


def test_a_name_read_before_the_paused_call_is_read_again(runner: Runner) -> None:
    # Documented difference: names (and constants) before the paused call in its statement are
    # not kept in temporaries; a call that rebinds such a global changes what the resumed
    # statement reads. Attributes and items are kept (see the previous tests).
    script = runner.write("names.py", """
        base = 1
        def bump():
            global base
            base = 1000
            for i in range(2):
                kill_here(f"b{i}")
            return 5
        total = base + bump()
        print(total)
    """)
    plain = runner.plain(script).stdout.strip()
    chain = runner.chain(script, kills="b0")
    assert plain == "6" and chain.stdout.strip() == "1005"


def test_generator_driving_statement_runs_again_without_its_calls(runner: Runner) -> None:
    script = runner.write("drive.py", """
        made = []
        def value():
            made.append(len(made))
            return len(made)
        def echo():
            got = None
            while True:
                for i in range(2):
                    kill_here(f"echo{got}-{i}")
                got = yield got
        gen = echo()
        next(gen)
        print(gen.send(value()), gen.send(value()), made)
    """)
    chain = runner.chain(script, kills="echo1-0,echo2-0")
    assert len(chain.segments) == 3
    runner.same_as_plain(script, chain)


def test_pause_waits_out_while_tests_finally_blocks_and_conditional_expressions(runner: Runner) -> None:
    script = runner.write("waits.py", """
        def busy(tag):
            for i in range(3):
                kill_here(f"{tag}{i}")
            return True
        n = 0
        while n < 2 and busy(f"while{n}-"):
            n += 1
            print("while body", n, flush=True)
        try:
            print("try", flush=True)
        finally:
            busy("fin")
            print("finally done", flush=True)
        y = busy("ifexp") if n else False
        print("after", y, flush=True)
    """)
    chain = runner.chain(script, kills="while0-0,fin1,ifexp0")
    runner.same_as_plain(script, chain)
    segs = chain.segments
    assert [s.returncode for s in segs] == [EXIT_PAUSED] * 3 + [0]
    # Each pause landed after the construct it was requested in: in the while body, after the
    # try statement, after the conditional expression's statement.
    assert segs[0].stdout == "" and segs[1].stdout.startswith("while body 1")
    assert segs[1].stdout.endswith("finally done\n")
    assert segs[2].stdout == "" and segs[3].stdout == "after True\n"
    assert "inside an expression" in chain.stderr
