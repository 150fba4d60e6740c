"""Signals from outside at random moments, each segment resumed under a Python version picked
in turn: the output must always be that of a run that never paused."""

from __future__ import annotations

import itertools
import random

from tests.execution.conftest import Runner, other_pythons

PROGRAM = """
import time
import numpy as np

def batches(data, bs):
    i = 0
    while i < len(data):
        chunk = data[i:i + bs]
        yield sum(chunk) / len(chunk)
        i += bs

def spin(n):
    t = 0
    for i in range(n):
        t += i
    return t

def step(state, x, k):
    if x % 3 == 0:
        state["fizz"] += 1
    else:
        state["other"] += 1
    try:
        if k % 7 == 6:
            raise ValueError(k)
        state["acc"] += x * 1.5 + (1 if spin(300) > 10 else 0)
    except ValueError as e:
        state["errors"].append(int(str(e)))
        spin(200)
    time.sleep(0.002)
    return state["acc"]

def train(epochs, data, names):
    state = {"fizz": 0, "other": 0, "acc": 0.0, "errors": []}
    rng = np.random.default_rng(0)
    w = np.zeros(4)
    k = 0
    for epoch in range(epochs):
        order = list(rng.permutation(len(data)))
        for i, (x, name) in enumerate(zip([data[j] for j in order], names)):
            acc = step(state, x, k)
            w += rng.standard_normal(4) * 0.01
            k += 1
            print(f"e{epoch} i{i} {name} x={x} acc={acc:.1f} w0={w[0]:+.5f}", flush=True)
        n = 0
        while n < 2:
            n += 1
            for m in batches(data, 5):
                spin(500)
                print(f"e{epoch} while n={n} mean={m:.2f}", flush=True)
    return state, w

state, w = train(3, list(range(1, 13)), [f"s{j}" for j in range(12)])
print("final", state, np.round(w, 6).tolist())
"""


def test_random_external_signals_across_versions(runner: Runner) -> None:
    script = runner.write("demo.py", PROGRAM, prelude=False)
    lines = len(runner.plain(script).stdout.splitlines())
    rng = random.Random(20241130)
    pythons = other_pythons()
    for trial in range(3):
        after = sorted(rng.sample(range(1, lines // 4), 3))
        gaps = [after[0]] + [b - a for a, b in itertools.pairwise(after)]
        rng.shuffle(pythons)
        chain = runner.external(script, after_lines=gaps, pythons=pythons)
        runner.same_as_plain(script, chain)
        assert sum(s.returncode == 75 for s in chain.segments) >= 2, f"trial {trial}\n" + chain.describe()
