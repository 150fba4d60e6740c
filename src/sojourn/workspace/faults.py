"""Fault points for the move protocol's tests: ``SOJOURN_FAULT="point:action[,point:action]"``.

Read once, at import: when the variable is unset, :func:`fault` is one dictionary test. The
points are named by process and step (``move.source.after-capsule``, ``move.dest.after-cas``,
... see docs/moves.md), so one variable, inherited by every process of a move, fires in the
right one. Actions:

* ``kill``: the process sends itself SIGKILL (a crash at exactly that step);
* ``exit``: it ends at once with exit code 3, running nothing (``os._exit``);
* ``wait``: it writes ``$SOJOURN_FAULT_DIR/<point>.hit`` (its pid) and waits until
  ``<point>.go`` appears there, so a test can act from outside at that step (``kill -9`` the
  process, corrupt a chunk, take the repository away) and then let it go on.

Each point fires once per process. A few names are switches rather than points
(:func:`switched`): ``move.source.as-remote:on`` makes a move's source treat its destination
as if it ran on another host (no pid check), so that a test on one host exercises the lease.
"""

from __future__ import annotations

import os
import signal
import time


def _parse(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in text.split(","):
        point, _, action = item.strip().rpartition(":")
        if point:
            out[point] = action
    return out


_FAULTS = _parse(os.environ.get("SOJOURN_FAULT", ""))
_FIRED: set[str] = set()


def fault(point: str) -> None:
    if not _FAULTS:
        return
    action = _FAULTS.get(point)
    if action is None or point in _FIRED:
        return
    _FIRED.add(point)
    folder = os.environ.get("SOJOURN_FAULT_DIR")
    if folder:
        with open(os.path.join(folder, f"{point}.hit"), "w") as f:
            f.write(str(os.getpid()))
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)  # the signal is on its way
    elif action == "exit":
        os._exit(3)
    elif action == "wait" and folder:
        go = os.path.join(folder, f"{point}.go")
        deadline = time.monotonic() + 600
        while not os.path.exists(go) and time.monotonic() < deadline:
            time.sleep(0.01)


def switched(name: str) -> bool:
    """Whether the test switch ``name`` is set in ``SOJOURN_FAULT`` (any action)."""
    return bool(_FAULTS) and name in _FAULTS
