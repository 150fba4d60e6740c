"""Pause under one Python minor version, carry on under another, and back.

Positions are statement ids from the source, so they mean the same statement on 3.11, 3.12 and
3.13; values travel as pickles, code as source. The script below mixes what differs between
those versions: comprehensions (a function of their own on 3.11, inlined on 3.12+, which turns
a variable into a cell on one and a plain local on the other), generators, closures, numpy.
"""

from __future__ import annotations

import sys

import pytest

from tests.conftest import needs_python
from tests.execution.conftest import EXIT_PAUSED, Runner

MIXED = """
import numpy as np

def windows(data, size):
    for start in range(0, len(data) - size + 1, size):
        kill_here(f"w{start}")
        yield data[start:start + size]

def make_scaler(factor):
    calls = 0
    def scale(xs):
        nonlocal calls
        calls += 1
        return [x * factor for x in xs], calls
    return scale

class Stats:
    def __init__(self):
        self.rows = []
    def add(self, row):
        for i, v in enumerate(row):
            kill_here(f"add{len(self.rows)}-{i}")
        self.rows.append(sum(row))

def main():
    data = list(range(24))
    rng = np.random.default_rng(7)
    scale = make_scaler(3)
    st = Stats()
    picked = [data[j] for j in rng.permutation(len(data))[:6]]
    for k, w in enumerate(windows(data, 4)):
        scaled, n = scale(w)
        st.add(scaled)
        noise = rng.standard_normal(2)
        print(k, scaled, n, picked[k % 6], np.round(noise, 6).tolist(), flush=True)
    print("rows", st.rows)

main()
"""


def _pythons(*versions: str) -> list[str]:
    return [needs_python(v) for v in versions]


@pytest.mark.parametrize("order", [("3.11", "3.13", "3.12", "3.11"), ("3.13", "3.11", "3.12")])
def test_chain_across_python_versions(runner: Runner, order: tuple[str, ...]) -> None:
    pythons = _pythons(*order)
    script = runner.write("mixed.py", MIXED)
    chain = runner.chain(script, kills="w4,add3-2,w16,add5-0", pythons=pythons)
    runner.same_as_plain(script, chain)
    assert [s.returncode for s in chain.segments] == [EXIT_PAUSED] * 4 + [0]
    assert [s.python for s in chain.segments] == [pythons[i % len(pythons)] for i in range(5)]


def test_seed_case_on_another_version(runner: Runner) -> None:
    other = needs_python("3.13" if sys.version_info[:2] != (3, 13) else "3.12")
    script = runner.write("seed.py", """
        for i in range(20):
            print(i, flush=True)
            kill_here(i)
        print("done")
    """)
    chain = runner.chain(script, kills="5,10,15", pythons=[sys.executable, other])
    runner.same_as_plain(script, chain)
    assert "restoring on" in chain.segments[1].stderr
