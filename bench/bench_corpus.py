"""The real-program corpus: every program unmoved, then paused at random points and resumed,
as one table and one summary line.

    python bench/bench_corpus.py [--pauses K] [--seed S] [--only NAME ...] [--pythons 3.11,3.12] [--json FILE]

The seed (printed first; ``SOJOURN_CORPUS_SEED`` or ``--seed`` replays it) draws, for each
program, the points in its unmoved running time where a pause is asked for and whether by
``sojourn suspend`` or by SIGTERM. The programs come from pinned PyPI archives
(tests/thirdparty.py), fetched into a cache outside the checkout; tests/corpus/manifest.py
says what each one is.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.corpus import harness  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pauses", type=int, default=int(os.environ.get("SOJOURN_CORPUS_PAUSES", "3")))
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--only", nargs="*", default=None, help="program names (or a part of one)")
    ap.add_argument("--pythons", default=None, help="comma-separated versions to use (default: all that fit)")
    ap.add_argument("--json", default=None, help="write the outcomes here")
    ap.add_argument("--verbose", "-v", action="store_true")
    opts = ap.parse_args()
    seed = opts.seed if opts.seed is not None else harness.corpus_seed()
    print(f"corpus seed {seed} (replay: SOJOURN_CORPUS_SEED={seed} or --seed {seed})", flush=True)
    progs = [p for p in harness.PROGRAMS if not opts.only or any(o in p.name for o in opts.only)]
    outcomes = []
    pythons = opts.pythons.split(",") if opts.pythons else None
    with tempfile.TemporaryDirectory(prefix="sojourn-corpus-") as tmp:
        cache = Path(tmp) / "cache"
        for prog in progs:
            t0 = time.monotonic()
            o = harness.run_program(prog, Path(tmp) / prog.name.replace("/", "_"), cache, seed, opts.pauses,
                                    pythons=pythons, log=(print if opts.verbose else None))
            outcomes.append(o)
            print(f"{o.line()} [{time.monotonic() - t0:.0f} s]", flush=True)
            for msg in o.refused + o.failed + ([o.error] if o.error else []) + ([o.wrong] if o.wrong else []):
                print("    " + msg.replace("\n", "\n    "), flush=True)
            for msg in o.notes:
                print("    note: " + msg, flush=True)
    print()
    print(harness.table(outcomes))
    print()
    print(harness.summary(outcomes, seed))
    if opts.json:
        Path(opts.json).write_text(json.dumps([dataclasses.asdict(o) for o in outcomes], indent=1))
    return 0 if all(o.ok for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
