"""A stand-in for asv in a corpus workspace: the harness, not the program.

numpy's benchmarks are classes that asv discovers, sets up and times. This driver runs one
class the way asv does (``setup(*params)`` for each parameter combination, then the timed
method ``--repeat`` times on the same instance) in this process, and prints a digest of the
instance's attributes after each combination: what the benchmark computed, to compare an
unmoved run with a paused one.

    python asv_run.py MODULE CLASS METHOD [--repeat N]
"""

import argparse
import hashlib
import importlib
import itertools

import numpy as np


def digest(value):
    if isinstance(value, np.ndarray):
        h = hashlib.sha256(np.ascontiguousarray(value).tobytes()).hexdigest()[:16]
        return f"ndarray{value.shape}:{value.dtype}:{h}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(digest(v) for v in value) + "]"
    if callable(value):
        return "<callable>"
    return repr(value)


def combinations(cls):
    params = getattr(cls, "params", None)
    if params is None:
        return [()]
    if params and not isinstance(params[0], list):
        params = [params]
    return list(itertools.product(*params))


def name_of(p):
    return getattr(p, "__name__", repr(p))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("module")
    ap.add_argument("cls")
    ap.add_argument("method")
    ap.add_argument("--repeat", type=int, default=1)
    opts = ap.parse_args()
    cls = getattr(importlib.import_module(opts.module), opts.cls)
    for params in combinations(cls):
        bench = cls()
        bench.setup(*params)
        for _ in range(opts.repeat):
            getattr(bench, opts.method)(*params)
        label = ", ".join(name_of(p) for p in params)
        for attr in sorted(vars(bench)):
            print(f"{opts.cls}({label}).{attr} = {digest(getattr(bench, attr))}", flush=True)


main()
