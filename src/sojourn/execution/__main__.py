"""``python -m sojourn.execution run SCRIPT [ARGS...] | resume CAPSULE | check CAPSULE``.

The engine's own entry point (tests, benchmarks, and the CLI's child processes). It behaves
like ``python SCRIPT``: the script's exit code, its uncaught exception printed as Python
prints it; a pause exits with 75 after printing the capsule id on stderr.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import traceback
from typing import Any


def _print_exception(e: BaseException) -> None:
    # Frames of sojourn itself (the runner, exec) are noise in the user's traceback.
    tb = e.__traceback__
    while tb is not None and "/sojourn/" in tb.tb_frame.f_code.co_filename.replace("\\", "/"):
        tb = tb.tb_next
    traceback.print_exception(type(e), e, tb)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sojourn.execution")
    parser.add_argument("--repo", default=None)
    parser.add_argument("--deadline", type=float, default=None,
                        help="seconds a pause requested by SIGTERM/SIGUSR1 may wait for a statement boundary")
    parser.add_argument("--scan-interval", type=float, default=600.0,
                        help="seconds between background checks that warn about state a pause would refuse (0: never)")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_run = sub.add_parser("run")
    p_run.add_argument("script")
    p_run.add_argument("args", nargs=argparse.REMAINDER)
    p_resume = sub.add_parser("resume")
    p_resume.add_argument("capsule")
    p_check = sub.add_parser("check")
    p_check.add_argument("capsule")
    ns = parser.parse_args(argv)

    from sojourn.execution import runner

    opts: dict[str, Any] = {"repo": ns.repo, "scan_interval": ns.scan_interval or None}
    if ns.deadline is not None:
        opts["signals"] = {signal.SIGTERM: ("exit", ns.deadline, "exit"),
                           signal.SIGUSR1: ("exit", ns.deadline, "continue")}
    try:
        if ns.cmd == "run":
            return runner.run_script(ns.script, ns.args, **opts)
        if ns.cmd == "resume":
            return runner.resume(ns.capsule, **opts)  # type: ignore[no-any-return]
        try:
            done: Any = runner.resume(ns.capsule, repo=ns.repo, run=False)
        except Exception as e:  # the check's answer is the JSON line, also when it fails
            print(json.dumps({"ok": False, "capsule": ns.capsule, "error": f"{type(e).__name__}: {e}"}))
            return 1
        print(json.dumps({"ok": True, "capsule": done.capsule, "python": done.python, "where": done.where,
                          "notes": done.notes, "timings": done.timings,
                          "edits": [{k: e[k] for k in ("path", "added", "removed")} for e in done.edits]}))
        return 0
    except SystemExit as e:
        code = e.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        print(code, file=sys.stderr)
        return 1
    except runner.ResumeError as e:
        print(f"sojourn: error: {e}", file=sys.stderr)
        return 2
    except BaseException as e:
        _print_exception(e)
        return 1


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.exit(code)
