"""Programs spread over several modules of the workspace: pauses inside imported modules'
functions, module state that changed while running, and library code never transformed."""

from __future__ import annotations

import sys

from tests.execution.conftest import Runner


def _project(runner: Runner) -> None:
    runner.write("mylib/__init__.py", """
        from mylib.stats import Running
        calls = 0
        def bump():
            global calls
            calls += 1
            return calls
    """, prelude=False)
    runner.write("mylib/stats.py", """
        import os, signal
        def _kill(tag):
            if tag in os.environ.get("KILLS", "").split(","):
                os.kill(os.getpid(), signal.SIGTERM)
        class Running:
            created = 0
            def __init__(self):
                Running.created += 1
                self.n = 0
                self.total = 0.0
            def add_all(self, values):
                for v in values:
                    _kill(f"add{self.n}")
                    self.n += 1
                    self.total += v
                return self.total / self.n
        def batches(data, size):
            for start in range(0, len(data), size):
                _kill(f"batch{start}")
                yield data[start:start + size]
    """, prelude=False)
    runner.write("train.py", """
        import json
        import mylib
        from mylib import stats
        from mylib.stats import batches

        def main():
            r = stats.Running()
            means = []
            for chunk in batches(list(range(20)), 4):
                means.append(r.add_all(chunk))
                mylib.bump()
                print(len(means), means[-1], mylib.calls, flush=True)
            print(json.dumps({"n": r.n, "created": stats.Running.created, "calls": mylib.calls}))
        main()
    """)


def test_pauses_inside_imported_workspace_modules(runner: Runner) -> None:
    _project(runner)
    script = runner.dir / "train.py"
    chain = runner.chain(script, kills="add3,batch8,add13,batch16")
    runner.same_as_plain(script, chain)
    assert len(chain.segments) == 5
    assert any("stats.py" in s.stderr and "in Running.add_all" in s.stderr for s in chain.segments)
    assert any("in batches" in s.stderr for s in chain.segments)


def test_library_modules_are_not_transformed(runner: Runner) -> None:
    _project(runner)
    script = runner.write("probe.py", """
        import json, sys
        import mylib.stats
        from sojourn.execution.runtime import RUNTIME
        names = sorted(RUNTIME.modules)
        print(names)
        print("__sojourn_flag__" in vars(json), "__sojourn_flag__" in vars(mylib.stats))
    """)
    seg = runner.segment(sys.executable, ["run", str(script)])
    assert seg.returncode == 0, seg.stderr
    assert seg.stdout.splitlines() == ["['__main__', 'mylib', 'mylib.stats']", "False True"]


def test_resume_refuses_an_edit_inside_a_paused_frame_and_names_it(runner: Runner) -> None:
    _project(runner)
    script = runner.dir / "train.py"
    first = runner.segment(sys.executable, ["run", str(script)], env={"KILLS": "add1"})
    assert first.capsule and "in Running.add_all" in first.stderr, first.stderr
    stats = runner.dir / "mylib" / "stats.py"
    original = stats.read_text()
    stats.write_text(original.replace("for v in values:", "for v in list(values):"))  # the loop add_all is in
    again = runner.segment(sys.executable, ["resume", first.capsule])
    assert again.returncode == 2
    line = original.splitlines().index("        for v in values:") + 1
    assert f"mylib/stats.py:{line} was edited inside Running.add_all(), which is paused at line" in again.stderr, \
        again.stderr
    # A comment is no edit of the program: the resume carries on as if nothing had changed.
    stats.write_text(original + "\n# edited\n")
    again = runner.segment(sys.executable, ["resume", first.capsule])
    assert again.returncode == 0, again.stderr
    assert first.stdout + again.stdout == runner.plain(script).stdout
