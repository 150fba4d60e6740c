"""Which edits touch a paused frame (sojourn.execution.edits, docs/execution.md "Editing a paused
program"): the boundary cases of the rule, decided on the captured and the edited source
alone (the end-to-end resumes are in test_edits.py)."""

from __future__ import annotations

import textwrap

import pytest

from sojourn.execution import edits
from sojourn.execution import transform as T

SOURCE = '''
import os

def helper(x):
    """Doubles."""
    return 2 * x

class Config:
    size = 3
    def scaled(self, k=2):
        return self.size * k

def step(x, tries=3):
    n = 0
    while n < tries:
        try:
            value = helper(x) + n
        except ValueError as e:
            print("bad", e)
        except KeyError:
            n += 1
            PAUSED_IN_HANDLER = 1
        else:
            n = tries
        finally:
            print("tried")
    match value:
        case 0:
            return "zero"
        case int(v) if v > 0:
            PAUSED_IN_CASE = 1
            return "positive"
        case _:
            return "other"

def later(x):
    return x

with open(os.devnull) as f:
    total = 0
    for i in range(3):
        total += len(step(i))  # PAUSED_IN_MODULE
print(later(total))
'''


def _frame(source: str, scope_qualname: str, marker: str) -> dict[str, object]:
    _, layout, _ = T.normalise(source, "__main__", "/w/prog.py")
    line = next(i for i, ln in enumerate(source.splitlines(), 1) if marker in ln)
    key = next(k for k, sc in layout.scopes.items() if sc.qualname == scope_qualname)
    sid = next(i for i, st in enumerate(layout.stmts) if st.scope == key and st.line == line)
    return {"module": "__main__", "scope": key, "sid": sid, "where": ""}


def _plan(old: str, new: str | None, frames: list[dict[str, object]]) -> edits.Plan:
    _, layout, _ = T.normalise(old, "__main__", "/w/prog.py")
    info = {"script": "/w/prog.py", "python": "3.x", "frames": frames,
            "sources": {"__main__": {"path": "/w/prog.py", "sha256": T.source_hash(old), "digest": layout.digest,
                                     "text": old}}}
    return edits.plan(info, {"__main__": ("/w/prog.py", new)})


FRAMES = [("<module>", "PAUSED_IN_MODULE"), ("step", "PAUSED_IN_HANDLER")]

ACCEPTED = [
    ("a comment, blank lines, trailing spaces", lambda s: "# note\n\n" + s.replace("n = 0\n", "n = 0   # start\n\n")),
    ("a docstring's text", lambda s: s.replace('"""Doubles."""', '"""Doubles x."""')),
    ("another function's body", lambda s: s.replace("return 2 * x", "return 3 * x")),
    ("a method not on the stack", lambda s: s.replace("return self.size * k", "return self.size")),
    ("a class body (its own scope)", lambda s: s.replace("    size = 3", "    size = 4\n    extra = 1")),
    ("the body of a function defined before the pause", lambda s: s.replace("    return x\n\nwith", "    return -x\n\nwith")),
    ("the handler's code after its paused statement", lambda s: s.replace("PAUSED_IN_HANDLER = 1", "PAUSED_IN_HANDLER = 1\n            n += 0")),
    ("a later handler clause: the else", lambda s: s.replace("n = tries\n", "n = tries + 1\n")),
    ("the finally block", lambda s: s.replace('print("tried")', 'print("tried again")')),
    ("the code after the loop", lambda s: s.replace("print(later(total))", "print(later(total), 'done')")),
    ("the module's code after its paused statement", lambda s: s.replace("# PAUSED_IN_MODULE", "# PAUSED_IN_MODULE\n        total += 0")),
]

REFUSED = [
    ("the while test it is in", "step", lambda s: s.replace("while n < tries:", "while n <= tries:")),
    ("the try body it ran", "step", lambda s: s.replace("value = helper(x) + n", "value = helper(x) - n")),
    ("an earlier handler", "step", lambda s: s.replace('print("bad", e)', 'print("worse", e)')),
    ("its own handler's type", "step", lambda s: s.replace("except KeyError:", "except (KeyError, IndexError):")),
    ("its handler's code before it", "step", lambda s: s.replace("            n += 1\n            PAUSED", "            n += 2\n            PAUSED")),
    ("its def line", "step", lambda s: s.replace("def step(x, tries=3):", "def step(x, tries=4):")),
    ("a statement added before it", "step", lambda s: s.replace("    n = 0\n", "    n = 0\n    m = 1\n")),
    ("a docstring added before it", "step", lambda s: s.replace("    n = 0\n", '    "Steps."\n    n = 0\n', 1)),
    ("the with manager the module is in", "<module>", lambda s: s.replace("open(os.devnull)", "open(os.devnull, 'rb')")),
    ("the loop header the module is in", "<module>", lambda s: s.replace("range(3)", "range(4)")),
    ("a def header run before the pause", "<module>", lambda s: s.replace("def helper(x):", "def helper(x, y=1):")),
    ("a class header run before the pause", "<module>", lambda s: s.replace("class Config:", "class Config(object):")),
    ("the paused statement itself", "<module>", lambda s: s.replace("len(step(i))", "len(str(step(i)))")),
    ("the paused function, removed", "step", lambda s: s.replace("def step(", "def step_renamed(")),
]


@pytest.mark.parametrize(("what", "edit"), ACCEPTED, ids=[a[0] for a in ACCEPTED])
def test_edits_that_touch_no_paused_frame_are_accepted(what: str, edit: object) -> None:
    new = edit(SOURCE)  # type: ignore[operator]
    assert new != SOURCE
    plan = _plan(SOURCE, new, [_frame(SOURCE, q, m) for q, m in FRAMES])
    assert plan.refused == [], what
    assert len(plan.changes) == 1 and plan.changes[0].diff.startswith("--- prog.py (captured)")


@pytest.mark.parametrize(("what", "frame", "edit"), REFUSED, ids=[r[0] for r in REFUSED])
def test_edits_inside_a_paused_frame_are_refused_naming_the_function_and_line(what: str, frame: str, edit: object) -> None:
    new = edit(SOURCE)  # type: ignore[operator]
    assert new != SOURCE
    plan = _plan(SOURCE, new, [_frame(SOURCE, q, m) for q, m in FRAMES])
    assert plan.changes == [] and plan.refused, what
    named = "step()" if frame == "step" else "the top-level code"
    if "removed" in what:
        assert "step() is no longer in prog.py, and it is paused at line 22 (as captured)" in plan.refused
        return
    changed = next(i for i, (a, b) in enumerate(zip(SOURCE.splitlines(), new.splitlines(), strict=False), 1) if a != b)
    assert f"prog.py:{changed} was edited inside {named}" in " ".join(plan.refused), plan.refused


def test_a_case_before_the_one_a_frame_is_in_is_part_of_it_a_later_one_is_not() -> None:
    frames = [_frame(SOURCE, "step", "PAUSED_IN_CASE")]
    assert _plan(SOURCE, SOURCE.replace("case 0:", "case 1:"), frames).touched
    assert _plan(SOURCE, SOURCE.replace("if v > 0", "if v > 1"), frames).touched
    assert not _plan(SOURCE, SOURCE.replace('return "other"', 'return "else"'), frames).refused


def test_a_generator_not_started_stands_at_its_def_line() -> None:
    src = textwrap.dedent('''
        def numbers(n):
            for i in range(n):
                yield i
        g = numbers(3)
        print(next(g))
    ''')
    assert "numbers@2" in T.normalise(src, "__main__", "/w/prog.py")[1].scopes
    frame = {"module": "__main__", "scope": "numbers@2", "sid": -1, "where": ""}
    assert not _plan(src, src.replace("yield i", "yield i * 2"), [frame]).refused
    assert _plan(src, src.replace("def numbers(n):", "def numbers(n, k=1):"), [frame]).touched


def test_a_deleted_file_and_an_unparsable_one_are_refused() -> None:
    frames = [_frame(SOURCE, "<module>", "PAUSED_IN_MODULE")]
    assert _plan(SOURCE, None, frames).refused == ["prog.py is gone, and the paused program runs its code"]
    broken = _plan(SOURCE, SOURCE.replace("def later(x):", "def later(x:"), frames)
    assert broken.refused and "prog.py does not parse now" in broken.refused[0]
