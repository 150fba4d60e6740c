"""A stand-in for pyperf in a corpus workspace: the harness, not the program.

pyperformance's benchmark programs end with ``pyperf.Runner().bench_func(...)``; the real
runner spawns worker processes, calibrates loops and prints timings. This one runs the
benchmark function in this process, ``--loops`` times, and prints what can be compared
between an unmoved and a paused run: the function's result when it is not a timing, and the
value of each ``--check`` expression evaluated in the program's globals afterwards.
It lives in the workspace (beside the program), so that its frames are the program's own
code: a pause can land while the benchmark runs under it.
"""

import argparse
import sys
import time

perf_counter = time.perf_counter


class Runner:
    def __init__(self, *args, add_cmdline_args=None, **kwargs):
        self.metadata = {}
        self.argparser = argparse.ArgumentParser()
        self.argparser.add_argument("--loops", type=int, default=1)
        self.argparser.add_argument("--check", action="append", default=[])
        self.args = None

    def parse_args(self, args=None):
        if self.args is None:
            self.args = self.argparser.parse_args(args)
        return self.args

    def bench_func(self, name, func, *args, inner_loops=None):
        opts = self.parse_args()
        result = None
        for _ in range(opts.loops):
            result = func(*args)
        self._report(name, opts, result)

    def bench_time_func(self, name, func, *args, inner_loops=None):
        opts = self.parse_args()
        func(opts.loops, *args)  # returns a timing: not compared
        self._report(name, opts, None)

    def _report(self, name, opts, result):
        print(f"{name}: {opts.loops} loops")
        if result is not None:
            print(f"{name}: result {result!r}")
        g = sys.modules["__main__"].__dict__
        for expr in opts.check:
            print(f"{name}: {expr} = {eval(expr, g)!r}")
        sys.stdout.flush()
