"""Open ``with`` blocks across a pause: the header never runs again; a file continues at its
offset, torch.no_grad() is still in force, the program's own context managers are exited
once; a context manager that cannot be entered again refuses the pause, precisely."""

from __future__ import annotations

import pytest

from tests.execution.conftest import EXIT_PAUSED, Runner


def test_file_opened_by_with_continues_at_its_offset(runner: Runner) -> None:
    (runner.dir / "data.txt").write_text("".join(f"line {i}\n" for i in range(8)))
    script = runner.write("reader.py", """
        opened = []
        def opener(path, mode):
            opened.append(path)
            return open(path, mode)
        with opener("data.txt", "r") as src, opener("out.txt", "w") as dst:
            for n, line in enumerate(src):
                kill_here(n)
                dst.write(line.upper())
                print(n, line.strip(), flush=True)
        print("opened", opened, src.closed, dst.closed)
        print(open("out.txt").read(), end="")
    """)
    chain = runner.chain(script, kills="2,5")
    assert len(chain.segments) == 3
    ref = runner.plain(script)
    assert chain.stdout == ref.stdout, chain.describe()
    assert chain.stdout.count("opened ['data.txt', 'out.txt']") == 1


def test_own_context_manager_and_contextmanager_generator(runner: Runner) -> None:
    script = runner.write("cms.py", """
        from contextlib import contextmanager
        class Section:
            depth = 0
            def __init__(self, name):
                self.name = name
            def __enter__(self):
                Section.depth += 1
                print("enter", self.name, flush=True)
                return self
            def __exit__(self, *exc):
                Section.depth -= 1
                print("exit", self.name, exc[0] is not None, flush=True)
                return False

        @contextmanager
        def tag(label):
            print("<" + label + ">", flush=True)
            try:
                yield label.upper()
            finally:
                print("</" + label + ">", flush=True)

        with Section("outer") as s:
            with tag("b") as t:
                for i in range(4):
                    kill_here(i)
                    print(s.name, t, i, Section.depth, flush=True)
        print("depth after", Section.depth)
    """)
    chain = runner.chain(script, kills="1,2")
    runner.same_as_plain(script, chain)
    assert chain.stdout.count("enter outer") == 1 and chain.stdout.count("exit outer") == 1
    assert len(chain.segments) == 3


def test_torch_no_grad_is_still_in_force_after_resume(runner: Runner) -> None:
    pytest.importorskip("torch")
    script = runner.write("nograd.py", """
        import torch
        w = torch.ones(3, requires_grad=True)
        outside = []
        with torch.no_grad():
            for i in range(3):
                kill_here(i)
                y = w * 2
                print(i, torch.is_grad_enabled(), y.requires_grad, flush=True)
        z = w * 2
        print("after", torch.is_grad_enabled(), z.requires_grad)
    """)
    chain = runner.chain(script, kills="1")
    assert len(chain.segments) == 2
    runner.same_as_plain(script, chain)


def test_library_context_manager_that_cannot_travel_refuses_the_pause(runner: Runner) -> None:
    script = runner.write("localctx.py", """
        import decimal
        with decimal.localcontext() as ctx:
            ctx.prec = 5
            for i in range(3):
                kill_here(i)
                print(i, decimal.Decimal(1) / decimal.Decimal(7), flush=True)
        print("done")
    """)
    chain = runner.chain(script, kills="1")
    assert [s.returncode for s in chain.segments] == [0]
    runner.same_as_plain(script, chain)
    err = chain.segments[0].stderr
    assert "pause refused" in err and "decimal" in err and "localctx.py" in err
    assert "register_context" in err


def test_paused_with_block_exits_once_on_exception(runner: Runner) -> None:
    script = runner.write("exc.py", """
        class Guard:
            def __enter__(self):
                print("enter", flush=True)
            def __exit__(self, kind, value, tb):
                print("exit with", kind.__name__ if kind else None, flush=True)
                return kind is KeyError
        with Guard():
            for i in range(3):
                kill_here(i)
                print(i, flush=True)
            raise KeyError("suppressed")
        print("after")
    """)
    chain = runner.chain(script, kills="0")
    assert [s.returncode for s in chain.segments] == [EXIT_PAUSED, 0]
    runner.same_as_plain(script, chain)
