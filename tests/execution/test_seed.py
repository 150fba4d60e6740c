"""The seed case: a program printing 0..19, moved to a new process after 5, 10 and 15."""

from __future__ import annotations

import random
import signal

from tests.execution.conftest import EXIT_PAUSED, Runner

SEED = """
import time
for i in range(20):
    print(i, flush=True)
    kill_here(i)
print("done")
"""


def test_moved_three_times_prints_exactly_what_an_unmoved_run_prints(runner: Runner) -> None:
    script = runner.write("seed.py", SEED)
    chain = runner.chain(script, kills="5,10,15")
    assert [s.returncode for s in chain.segments] == [EXIT_PAUSED] * 3 + [0]
    runner.same_as_plain(script, chain)
    # Each pause lands at the next statement boundary: the top of the next iteration.
    assert chain.segments[0].stdout.splitlines()[-1] == "5"
    assert chain.segments[1].stdout.splitlines()[0] == "6"
    assert len(set(chain.capsules)) == 3


def test_sigusr1_pauses_like_sigterm(runner: Runner) -> None:
    script = runner.write("seed.py", SEED.replace("kill_here(i)", "kill_here(i, signal.SIGUSR1)").replace("import time", "import signal"))
    chain = runner.chain(script, kills="3,12")
    assert [s.returncode for s in chain.segments] == [EXIT_PAUSED, EXIT_PAUSED, 0]
    runner.same_as_plain(script, chain)
    assert "SIGUSR1" in chain.segments[0].stderr


def test_signals_from_outside_at_random_points(runner: Runner) -> None:
    script = runner.write("slow.py", """
        import time
        total = 0
        for i in range(40):
            total += i
            print(i, total, flush=True)
            time.sleep(0.01)
        print("done", total)
    """)
    rng = random.Random(1234)
    for _ in range(3):
        after = [rng.randint(1, 8) for _ in range(3)]
        chain = runner.external(script, after_lines=after, sig=signal.SIGTERM)
        runner.same_as_plain(script, chain)
        assert sum(s.returncode == EXIT_PAUSED for s in chain.segments) >= 2, chain.describe()
