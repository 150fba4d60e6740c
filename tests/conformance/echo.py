"""The fresh interpreter of a conformance run: restore every recorded capsule, capture it again.

Run as ``python echo.py REPO RECORDED.json OUT.json`` by an interpreter of the Python version
under test, in a process that has loaded nothing else: each capsule the record run wrote is
restored here (sojourn checks its fingerprints against what was captured), and what came back
is captured again, so the replay run (``cpshim``, mode ``replay``) hands the test the object
that went there and back. One process restores the whole batch, in the order of the record
run; what fails is written down as that round trip's error, and the rest go on.
"""

from __future__ import annotations

import json
import sys
import traceback


def main(repo: str, recorded: str, out: str) -> None:
    import sojourn

    with open(recorded) as f:
        tests = json.load(f)["tests"]
    echoed: dict[str, list[object]] = {}
    for nodeid, entry in sorted(tests.items()):
        if entry["outcome"] not in ("passed", "failed"):
            continue  # skipped where it was recorded: nothing to judge
        trips: list[object] = []
        for cid in entry["capsules"]:
            if not isinstance(cid, str):
                trips.append(cid)
                continue
            try:
                ns = sojourn.restore(cid, repo)
                trips.append(sojourn.capture({"obj": ns["obj"]}, repo).id)
            except Exception as e:  # one object's failure must not stop the batch
                where = traceback.extract_tb(e.__traceback__)[-1]
                trips.append({"error": f"Python {sys.version_info[0]}.{sys.version_info[1]}: "
                              f"{type(e).__name__}: {e} (at {where.filename}:{where.lineno})"})
        echoed[nodeid] = trips
    with open(out, "w") as f:
        json.dump(echoed, f, indent=1, sort_keys=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
