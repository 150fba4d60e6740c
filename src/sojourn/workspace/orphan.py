"""A session whose supervisor died records its own pause.

Called in the session process, after its capsule is written and before it exits: the output
its supervisor had not logged (the rest of the session's output files beyond the offsets the
allocation's pieces end at, logs.py) becomes the allocation's last log pieces, the capsule
gets its write check, and the ``capsule`` and ``stopped`` events are appended under
the allocation's epoch (so they are void if someone else took the workspace meanwhile).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from sojourn.repository.repo import open_repository
from sojourn.workspace import events as E
from sojourn.workspace import records as R
from sojourn.workspace.capsules import verify_capsule
from sojourn.workspace.logs import log_rest
from sojourn.workspace.store import WorkspaceStore


def log_the_rest(repo: Any, ws: str, al: str) -> None:
    """What the session wrote and its supervisor had not logged becomes the allocation's
    last log pieces (this process's own buffered output first goes into its files)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    log_rest(repo.backend, ws, al)


def _started_unless_recorded(rec: R.WorkspaceRecord, al: str) -> list[E.Event]:
    """This session's ``started`` event, when its supervisor died before writing it (the
    record then names no session for the allocation, and the steps it ran would be no one's)."""
    a = rec.allocation(al)
    if a is None or a.session_pid is not None:
        return []
    import platform

    from sojourn.procs import process_start
    from sojourn.workspace.logs import output_base

    return [E.Started(allocation=al, session_pid=os.getpid(), output=output_base(rec.id, al),
                      session_pid_start=process_start(os.getpid()), python_version=platform.python_version(),
                      python=platform.python_version(), arch=platform.machine(), platform=sys.platform)]


def record_orphan_pause(repo_url: str, ws: str, al: str, epoch: int, msg: dict[str, Any]) -> None:
    with open_repository(repo_url) as repo:
        store = WorkspaceStore(repo)
        log_the_rest(repo, ws, al)
        error = None if msg.get("checked") else verify_capsule(repo_url, msg["capsule"], python=sys.executable,
                                                               cwd=os.getcwd())
        entry = R.CapsuleEntry(id=msg["capsule"], parent=msg.get("parent"), reason=str(msg.get("reason")),
                               where=str(msg.get("where", "")), size=int(msg.get("size", 0)), time=R.now(),
                               allocation=al, verified=error is None, error=error)
        rec = store.record(ws, save=False)
        previous = rec.last_capsule.id if rec.last_capsule else None
        reason, detail = E.exit_reason(None, None, entry)
        store.append(ws, epoch, al, *_started_unless_recorded(rec, al),
                     E.CapsuleEvent(capsule=dict(entry.__dict__)),
                     E.stop(al, reason, f"{detail}; its supervisor (the sojourn command) was gone, so the session "
                                        "paused by itself",
                            produced=entry.id if entry.verified else None, standing=previous,
                            max_rss=msg.get("max_rss")))
        store.record(ws)


def record_orphan_exit(repo_url: str, ws: str, al: str, epoch: int, msg: dict[str, Any]) -> None:
    """The program ended (``msg``: the session's ``exit`` report) after its supervisor died and
    before the orphan's pause could land: record the allocation's end as the supervisor
    would have (finished, or failed on the last good capsule)."""
    code, ran = msg.get("code"), bool(msg.get("ran", True))
    reason, what = E.exit_reason(code, msg)  # as the supervisor would have decided
    with open_repository(repo_url) as repo:
        store = WorkspaceStore(repo)
        log_the_rest(repo, ws, al)
        rec = store.record(ws, save=False)
        standing = rec.last_capsule.id if rec.last_capsule else None
        store.append(ws, epoch, al, *_started_unless_recorded(rec, al),
                     E.stop(al, reason, f"{what}; its supervisor (the sojourn command) was gone, so the session "
                                        "recorded its end itself",
                            standing=standing, ran=ran, exit_code=code, max_rss=msg.get("max_rss")))
        store.record(ws)
