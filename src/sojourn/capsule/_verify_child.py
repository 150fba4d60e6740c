"""Run by ``sojourn.verify`` in a fresh interpreter: restore, compare, report as JSON."""

from __future__ import annotations

import json
import platform
import sys
import warnings


def main(argv: list[str]) -> int:
    capsule, repo, files_to = argv
    from sojourn.capsule.restore import restore_capsule
    from sojourn.errors import SojournError
    from sojourn.repository.repo import open_repository

    report: dict[str, object] = {"python": platform.python_version(), "ok": False}
    try:
        with warnings.catch_warnings(record=True) as caught, open_repository(repo) as r:
            warnings.simplefilter("always")
            ns = restore_capsule(r, capsule, files_to=files_to)
            report["variables"] = [
                {"name": v.name, "type": v.type, "fingerprint": v.fingerprint, "match": True}
                for v in ns.manifest.variables
            ]
            report["notes"] = list(dict.fromkeys(ns.notes + [str(w.message) for w in caught]))
            report["ok"] = True
    except SojournError as e:
        report["error"] = str(e)
    print(json.dumps(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
