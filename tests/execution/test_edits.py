"""Editing a program while it is paused (docs/execution.md, "Editing a paused program"): an
edit that leaves the paused frames alone is accepted on resume and its new code runs; an
edit inside a paused frame is refused, naming the file, line and function."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import needs_python
from tests.execution.conftest import EXIT_PAUSED, Runner

WORK = """
    def helper(x):
        return x + 1

    def later(x):
        return x * 2

    def work(n):
        "Adds up helper(i)."
        total = 0
        for i in range(n):
            kill_here(f"w{len(out)}-{i}")
            total += helper(i)
        return total

    out = []
    for k in range(3):
        out.append(work(3))
        print(k, out[-1], flush=True)
    print("done", later(len(out)))
"""


def _paused(runner: Runner, body: str = WORK, kills: str = "w0-1") -> tuple[Path, str, str]:
    """The script, paused inside work() (at its loop's head, i == 2) on its first call."""
    script = runner.write("prog.py", body)
    seg = runner.segment(sys.executable, ["run", str(script)], env={"KILLS": kills})
    assert seg.returncode == EXIT_PAUSED and seg.capsule, seg.stderr
    assert "in work" in seg.stderr
    return script, seg.capsule, seg.stdout


def _edit(script: Path, old: str, new: str) -> None:
    text = script.read_text()
    assert old in text, old
    script.write_text(text.replace(old, new, 1))


def _resume(runner: Runner, capsule: str, python: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(runner.cmd(python or sys.executable, "resume", capsule), cwd=runner.dir, env=runner.env,
                          capture_output=True, text=True, timeout=300)


def _line(script: Path, text: str) -> int:
    return next(i for i, ln in enumerate(script.read_text().splitlines(), 1) if text in ln)


def test_comments_blank_lines_whitespace_and_docstrings_do_not_block_a_resume(runner: Runner) -> None:
    script, cap, before = _paused(runner)
    text = "# notes added while paused\n\n\n" + script.read_text()
    text = text.replace("    total = 0\n", "    # start from zero\n    total = 0   \n")
    text = text.replace('"Adds up helper(i)."', '"""Adds up helper(i), for i below n."""')
    text = text.replace("out.append(work(3))", "out.append(work(  3 ))  # spaces inside the call")
    script.write_text(text)
    again = _resume(runner, cap)
    assert again.returncode == 0, again.stderr
    assert before + again.stdout == runner.plain(script).stdout  # the same program
    assert "prog.py changed since capsule" in again.stderr and "+# notes added while paused" in again.stderr


def test_a_function_not_on_the_stack_runs_its_new_code_when_next_called(runner: Runner) -> None:
    script, cap, before = _paused(runner)
    _edit(script, "return x + 1", "return x + 100")
    _edit(script, "return x * 2", "return x * 1000")
    again = _resume(runner, cap)
    assert again.returncode == 0, again.stderr
    # work(3) had added helper(0) + helper(1) = 3 with the old code; i == 2 calls the new one.
    assert before == ""
    assert again.stdout.splitlines() == ["0 105", "1 303", "2 303", "done 3000"]


def test_an_edit_after_the_paused_statement_of_a_paused_frame_runs(runner: Runner) -> None:
    script, cap, _ = _paused(runner)
    _edit(script, "total += helper(i)", "total += 10 * helper(i)")  # after the paused kill_here(...)
    _edit(script, "    return total", "    return -total")
    _edit(script, "print(k, out[-1], flush=True)", "print('k =', k, out[-1], flush=True)")  # after the paused call
    again = _resume(runner, cap)
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines() == ["k = 0 -33", "k = 1 -60", "k = 2 -60", "done 6"]


def test_an_edit_before_the_paused_statement_of_a_paused_frame_is_refused_naming_it(runner: Runner) -> None:
    script, cap, before = _paused(runner)
    original = script.read_text()
    cases = [
        ("    total = 0", "    total = 1", "work()"),  # in work(), before its paused statement
        ("for i in range(n):", "for i in range(n + 1):", "work()"),  # the header of the loop it is in
        ('kill_here(f"w{len(out)}-{i}")', 'kill_here(f"w{len(out)}-{i}", _signal.SIGUSR1)', "work()"),  # its statement
        ("def work(n):", "def work(n, m=0):", "work()"),  # its def line
        ("out = []", "out = [0]", "the top-level code"),  # the main script's code before its paused call
    ]
    for old, new, what in cases:
        _edit(script, old, new)
        refused = _resume(runner, cap)
        line = _line(script, new.strip())
        assert refused.returncode == 2, (old, refused.stderr)
        assert f"prog.py:{line} was edited inside {what}, which is paused at line" in refused.stderr, refused.stderr
        assert refused.stdout == "" and "Traceback" not in refused.stderr
        script.write_text(original)
    # The capsule is intact: undone, the edit no longer blocks the resume.
    again = _resume(runner, cap)
    assert again.returncode == 0, again.stderr
    assert before + again.stdout == runner.plain(script).stdout


def test_a_removed_paused_function_or_a_deleted_file_is_refused(runner: Runner) -> None:
    script, cap, _ = _paused(runner)
    original = script.read_text()
    _edit(script, "def work(n):", "def work2(n):")
    refused = _resume(runner, cap)
    assert refused.returncode == 2 and "work() is no longer in prog.py, and it is paused at line" in refused.stderr
    script.unlink()
    gone = _resume(runner, cap)
    assert gone.returncode == 2 and "prog.py is gone" in gone.stderr and f"sojourn source {cap} --to DIR" in gone.stderr
    script.write_text(original)
    assert _resume(runner, cap).returncode == 0


def test_edits_in_a_module_the_script_imports(runner: Runner) -> None:
    runner.write("mylib/__init__.py", "", prelude=False)
    runner.write("mylib/calc.py", """
        import os, signal
        def scale(x):
            return x * 2
        def accumulate(values):
            acc = 0
            for v in values:
                if v == 2 and os.environ.get("KILLS"):
                    os.kill(os.getpid(), signal.SIGTERM)
                acc += scale(v)
            return acc
    """, prelude=False)
    script = runner.write("main.py", """
        from mylib import calc
        for k in range(2):
            print(k, calc.accumulate(range(4)), flush=True)
    """)
    calc = runner.dir / "mylib" / "calc.py"
    original = calc.read_text()
    first = runner.segment(sys.executable, ["run", str(script)], env={"KILLS": "1"})
    assert first.returncode == EXIT_PAUSED and "in accumulate" in first.stderr, first.stderr
    _edit(calc, "    acc = 0", "    acc = 100")
    refused = _resume(runner, first.capsule or "")
    assert refused.returncode == 2
    assert f"calc.py:{_line(calc, 'acc = 100')} was edited inside accumulate()" in refused.stderr, refused.stderr
    calc.write_text(original)
    _edit(calc, "return x * 2", "return x * 10")  # not on the stack: accepted, the new code runs
    again = _resume(runner, first.capsule or "")
    assert again.returncode == 0, again.stderr
    # accumulate had added scale(0) + scale(1) = 2; v == 2 and 3 use the new scale.
    assert again.stdout.splitlines() == ["0 36", "1 60"]
    assert "mylib/calc.py changed since capsule" in again.stderr


def test_an_edit_to_a_suspended_generator(runner: Runner) -> None:
    body = """
        def numbers(n):
            base = 10
            for i in range(n):
                yield base + i
            print("numbers done", flush=True)

        gen = numbers(5)
        for k in range(5):
            kill_here(k)
            print(k, next(gen), flush=True)
    """
    script = runner.write("gen.py", body)
    first = runner.segment(sys.executable, ["run", str(script)], env={"KILLS": "2"})
    assert first.returncode == EXIT_PAUSED and first.capsule, first.stderr
    original = script.read_text()
    _edit(script, "base = 10", "base = 20")  # before the yield it stopped at
    refused = _resume(runner, first.capsule)
    assert refused.returncode == 2 and f"gen.py:{_line(script, 'base = 20')} was edited inside numbers()" in refused.stderr
    script.write_text(original)
    _edit(script, "yield base + i", "yield base + i\n        print('after a yield', flush=True)")
    again = _resume(runner, first.capsule)
    assert again.returncode == 0, again.stderr
    # It was paused at its loop's head (its next() runs again); the new line runs after its yields.
    assert again.stdout.splitlines() == ["2 12", "after a yield", "3 13", "after a yield", "4 14"]


def test_an_accepted_edit_resumes_across_python_versions(runner: Runner) -> None:
    py313 = needs_python("3.13")
    script, cap, _ = _paused(runner)
    _edit(script, "return x + 1", "return x + 100")
    again = _resume(runner, cap, python=py313)
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines() == ["0 105", "1 303", "2 303", "done 6"]
    assert re.search(r"prog\.py changed since capsule cap_\w+ was written \(\+1 -1 lines\)", again.stderr)


def test_an_edited_class_and_an_edited_module_function_get_their_new_code(runner: Runner) -> None:
    # A class is made again by its edited statement (a changed method, a new one whose default
    # reads a global); a module function gains a parameter with a default. The fingerprint check compares
    # what the capsule holds of them, and the new code runs.
    runner.write("helpers.py", "def fmt(x):\n    return str(x)\n\ndef tag(x):\n    return x\n", prelude=False)
    script = runner.write("acc.py", """
        import helpers
        LIMIT = 5
        class Acc:
            def __init__(self):
                self.total = 0
            def add(self, x):
                self.total += x
                return self.total
        acc = Acc()
        for i in range(4):
            kill_here(i)
            print(i, helpers.fmt(acc.add(i)), flush=True)
        print("end", helpers.tag(acc.total))
    """)
    first = runner.segment(sys.executable, ["run", str(script)], env={"KILLS": "2"})
    assert first.returncode == EXIT_PAUSED and first.capsule, first.stderr
    _edit(script, "        self.total += x\n", "        self.total += 10 * x\n")
    _edit(script, "        return self.total\n", "        return self.total\n    def capped(self, k=LIMIT):\n"
                                                  "        return min(self.total, k)\n")
    _edit(script, 'print("end", helpers.tag(acc.total))',
          'print("end", helpers.tag(acc.total), acc.capped(), isinstance(acc, Acc))')
    helpers = runner.dir / "helpers.py"  # fmt() is paused at its start (it calls str()); tag() is not
    _edit(helpers, "def tag(x):\n    return x\n", "def tag(x, prefix='='):\n    return prefix + str(x)\n")
    again = _resume(runner, first.capsule)
    assert again.returncode == 0, again.stderr
    assert first.stdout.splitlines() == ["0 0", "1 1"]
    # Paused in fmt() at i == 2: add(2) had run (old code); add(3) runs the new one.
    assert again.stdout.splitlines() == ["2 3", "3 33", "end =33 5 True"]
    assert "acc.py changed since capsule" in again.stderr and "helpers.py changed since capsule" in again.stderr
