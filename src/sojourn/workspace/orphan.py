"""A session whose supervisor died records its own pause.

Called in the session process, after its capsule is written and before it exits: the output
since the supervisor died (kept in a spill file) becomes the allocation's last log piece, the
capsule gets its write check, and the ``capsule`` and ``stopped`` events are appended under
the allocation's epoch (so they are void if someone else took the workspace meanwhile).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from sojourn.repository.repo import open_repository
from sojourn.workspace import records as R
from sojourn.workspace.capsules import verify_capsule
from sojourn.workspace.logs import LogWriter, next_free_seq
from sojourn.workspace.store import WorkspaceStore


def record_orphan_pause(repo_url: str, ws: str, al: str, epoch: int, msg: dict[str, Any], spill: str | None) -> None:
    with open_repository(repo_url) as repo:
        store = WorkspaceStore(repo)
        if spill:
            log = LogWriter(repo.backend, ws, al, first_seq=next_free_seq(repo.backend, ws, al))
            sys.stdout.flush()
            sys.stderr.flush()
            for stream, suffix in (("stdout", ".out"), ("stderr", ".err")):
                for part in (suffix + ".0", suffix):  # what the pipe held, then what came after
                    try:
                        with open(spill + part, "rb") as f:
                            log.write(stream, f.read())
                        os.unlink(spill + part)
                    except OSError:
                        pass
            log.flush()
        error = verify_capsule(repo_url, msg["capsule"], python=sys.executable, cwd=os.getcwd())
        entry = R.CapsuleEntry(id=msg["capsule"], parent=msg.get("parent"), reason=str(msg.get("reason")),
                               where=str(msg.get("where", "")), size=int(msg.get("size", 0)), time=R.now(),
                               allocation=al, verified=error is None, error=error)
        rec = store.record(ws, save=False)
        previous = rec.last_capsule.id if rec.last_capsule else None
        standing = entry.id if entry.verified else previous
        reason = "suspended" if entry.verified else "failed"
        store.append(ws, epoch, al,
                     {"type": "capsule", "capsule": entry.__dict__},
                     {"type": "stopped", "allocation": al, "reason": reason,
                      "detail": "its supervisor (the sojourn command) was gone, so the session paused by itself"
                                + ("" if entry.verified else f"; the capsule failed its check: {error}"),
                      "exit_code": None, "max_rss": msg.get("max_rss"), "spend": 0.0,
                      "state": R.state_after_stop(reason, entry.id if entry.verified else None), "capsule": standing})
        store.record(ws)
