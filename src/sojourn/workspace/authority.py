"""Taking a workspace's authority: the epoch compare-and-swap, and the one repair it needs.

``WorkspaceStore.acquire`` is the primitive (an exclusive create of ``epoch.<ws>.<n+1>``).
A taker that won epoch n+1 must then append its ``authority`` event; one that dies in
between leaves an epoch that nobody published. The record still names epoch n, so every
later taker would lose the swap forever. :func:`take` steps over such an epoch when its
holder is provably gone (a dead process on this host) and refuses otherwise, naming who is
taking the workspace right now.
"""

from __future__ import annotations

import os
from typing import Any

from sojourn.workspace import records as R
from sojourn.workspace.errors import AuthorityLost, WorkspaceError
from sojourn.workspace.liveness import alive, boot_id, gone, hostname, me
from sojourn.workspace.store import WorkspaceStore


def _holder_gone(doc: dict[str, Any]) -> bool:
    if doc.get("host") != hostname():
        return False
    if doc.get("boot_id") and doc.get("boot_id") != boot_id():
        return True
    return not alive(doc.get("pid"), doc.get("pid_start"))


def take(store: WorkspaceStore, rec: R.WorkspaceRecord, holder: str, reason: str) -> int:
    """Win the epoch after the record's (or after an unpublished one whose holder is dead),
    append the ``authority`` event, and return the new epoch."""
    current, doc = store.epoch(rec.id, rec.epoch)
    if current > rec.epoch and (doc is None or not _holder_gone(doc)):
        who = (doc or {}).get("holder")
        where = f" on {doc.get('host')} (pid {doc.get('pid')})" if doc else ""
        raise WorkspaceError(f"another command ({who}{where}) is taking workspace {rec.id} right now "
                             f"(epoch {current}); look again with `sojourn show {rec.id}`")
    info = {"reason": reason, **me()}
    try:
        epoch = store.acquire(rec.id, current, holder, **info)
    except AuthorityLost as e:
        raise WorkspaceError(f"workspace {rec.id} was taken by {e.holder} (epoch {e.epoch}) at the same "
                             "moment; nothing was started here") from None
    store.append(rec.id, epoch, holder, {"type": "authority", "holder": holder, **info})
    return epoch


def reap(store: WorkspaceStore, rec: R.WorkspaceRecord, *, by: str = "sojourn") -> R.WorkspaceRecord:
    """If ``rec`` says running but its holder's processes are gone, record the allocation as
    failed and return the new record. Whoever notices first takes the authority by
    compare-and-swap, so two readers never both record it; the workspace then stands on its
    last good capsule."""
    if rec.state != "running" or _why_gone(rec) is None:
        return rec
    rec = store.record(rec.id)  # the dead cannot write any more: what the log says now is final
    why = _why_gone(rec) if rec.state == "running" else None
    if why is None:
        return rec
    a = rec.current
    gone_holder = a.id if a is not None else (rec.holder or "its creator")
    holder = f"recovery:{hostname()}:{os.getpid()}"
    try:
        epoch = take(store, rec, holder, f"{gone_holder} is gone (noticed by {by})")
    except WorkspaceError:
        return store.record(rec.id)  # another reader is recording it
    cap = rec.last_capsule.id if rec.last_capsule else None
    # A taker that died before it started anything leaves the workspace where it was.
    ran = a is not None
    store.append(rec.id, epoch, holder,
                 {"type": "stopped", "allocation": gone_holder, "reason": "failed", "detail": why, "exit_code": None,
                  "state": R.state_after_stop("failed", None if ran else cap, ran), "capsule": cap, "ran": ran})
    return store.record(rec.id)


def _why_gone(rec: R.WorkspaceRecord) -> str | None:
    a = rec.current
    if a is not None:
        return gone(a)
    taker = rec.taker or {}
    if taker.get("pid") and _holder_gone(taker):
        return f"{rec.holder} took the workspace but its process (pid {taker.get('pid')} on {taker.get('host')}) is gone"
    return None
