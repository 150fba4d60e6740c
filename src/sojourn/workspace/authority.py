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
import sys
from typing import Any

from sojourn.capsule import format as fmt
from sojourn.threads import Executor
from sojourn.workspace import events as E
from sojourn.workspace import records as R
from sojourn.workspace.capsules import capsule_facts, record_python, verify_capsule
from sojourn.workspace.errors import AuthorityLost, WorkspaceError
from sojourn.workspace.liveness import alive, boot_id, gone, hostname, me
from sojourn.workspace.store import WorkspaceStore

LABEL = "sojourn.workspace"  # what every session stamps on its capsules: {workspace, allocation, epoch}
EXECUTION_LABEL = "sojourn.execution"  # the engine's: reason, where, argv...
_LABELS: dict[str, dict[str, tuple[str, str] | None]] = {}  # repository -> capsule -> (workspace, allocation)


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
    last good capsule, or on the capsule the dead allocation wrote and never recorded, once
    that one passed its write check (:func:`unrecorded_capsule`)."""
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
    if a is not None:  # what its session wrote and its dead supervisor had not logged (logs.py)
        from sojourn.workspace.logs import log_rest

        try:
            log_rest(store.backend, rec.id, a.id, base=a.output)
        except Exception as e:  # the stop must be recorded all the same
            print(f"sojourn: the rest of the output of {a.id} could not be logged: {e}", file=sys.stderr)
    cap = rec.last_capsule.id if rec.last_capsule else None
    # A taker that died before it started anything leaves the workspace where it was.
    ran = a is not None
    # Only a session that started can have written a capsule: the listing is not paid for
    # takers that died early, nor by the readers that lost the swap above.
    found = unrecorded_capsule(store, rec, a) if a is not None and a.session_pid else None
    if a is not None and found is not None:
        store.append(rec.id, epoch, holder, *_recovered(store, rec, a, found, why))
    else:
        store.append(rec.id, epoch, holder, E.stop(gone_holder, "failed", why, standing=cap, ran=ran))
    return store.record(rec.id)


def unrecorded_capsule(store: WorkspaceStore, rec: R.WorkspaceRecord, a: R.Allocation) -> fmt.Manifest | None:
    """The newest capsule that allocation ``a``'s session wrote and no event records.

    A session reports its capsule and exits; its supervisor records it only after the write
    check, so a supervisor that dies in between leaves a complete capsule that the log does
    not name. Every capsule a session writes carries the ``sojourn.workspace`` label
    ``{workspace, allocation, epoch}``, and its parent chain starts at the capsule the
    allocation resumed from: that is how it is found (one listing, then the manifests of the
    capsules no event names)."""
    backend, key = store.repo.backend, store.repo.key
    known = {c.id for c in rec.capsules} | {x.capsule_in for x in rec.allocations if x.capsule_in}
    names = [n[: -len(".json")] for n in backend.list("capsules") if n.endswith(".json")]
    names = [n for n in names if n not in known]
    # Manifests never change (a capsule's id is its hash): a process that reaps many
    # workspaces (`ps` after a reboot) reads each one once.
    labels = _LABELS.setdefault(backend.url, {})

    def load(cap: str) -> fmt.Manifest | None:
        try:
            m = fmt.open_manifest(backend.load("capsules", cap + ".json"), key, expected_id=cap)
        except Exception:  # removed meanwhile, or unreadable: it cannot be resumed from either
            return None
        label = m.labels.get(LABEL)
        labels[cap] = (str(label.get("workspace")), str(label.get("allocation"))) if isinstance(label, dict) else None
        return m

    unread = [n for n in names if n not in labels]
    with Executor(max_workers=16) as pool:  # S3 answers one manifest at a time
        read = {m.id: m for m in pool.map(load, unread) if m is not None}
    found: dict[str, fmt.Manifest] = {}
    for cap in names:
        if labels.get(cap) == (rec.id, a.id):
            m = read.get(cap) or load(cap)
            if m is not None:
                found[cap] = m
    # Its lineage: what it resumed from, what it recorded (checkpoints), what it left unrecorded.
    lineage = {a.capsule_in, *(c.id for c in rec.capsules if c.allocation == a.id), *found}
    parents = {m.parent for m in found.values()}
    tips = [m for c, m in found.items() if c not in parents and m.parent in lineage]
    return max(tips, key=lambda m: m.created) if tips else None


def _recovered(store: WorkspaceStore, rec: R.WorkspaceRecord, a: R.Allocation, m: fmt.Manifest,
               why: str) -> list[dict[str, Any]]:
    """The ``capsule`` and ``stopped`` events of a dead allocation whose capsule the reaper
    found: checked in a fresh interpreter (the allocation's when this host has it), as the
    supervisor would have."""
    info = m.labels.get(EXECUTION_LABEL)
    info = info if isinstance(info, dict) else {}
    python = record_python(rec, a)
    cwd = next((d for d in (a.scratch, rec.command.cwd) if d and os.path.isdir(d)), os.getcwd())
    error = verify_capsule(store.repo.url, m.id, python=python, cwd=cwd)
    entry = R.CapsuleEntry(id=m.id, parent=m.parent, reason=str(info.get("reason", "")), where=str(info.get("where", "")),
                           size=m.size, time=R.now(), allocation=a.id, verified=error is None, error=error)
    facts = capsule_facts(store.repo, m.id) if error is None else {}
    events: list[dict[str, Any]] = [{"type": "capsule", "capsule": entry.__dict__, "recovered": True,
                                     "distributions": facts.get("distributions"), "arch": facts.get("arch")}]
    said = f"{why}; its supervisor died before recording capsule {m.id}"
    if error is None:
        reason, _ = E.exit_reason(None, None, entry)
        detail = f"{said}, which the reaper checked and recovered: paused ({entry.reason}) at {entry.where}"
        events.append(E.stop(a.id, reason, detail, produced=m.id).to_json())
        return events
    cap = rec.last_capsule.id if rec.last_capsule else None
    events.append(E.stop(a.id, "failed", f"{said}, which the reaper found but which failed its write check: {error}",
                         standing=cap).to_json())
    return events


def _why_gone(rec: R.WorkspaceRecord) -> str | None:
    a = rec.current
    if a is not None:
        return gone(a)
    taker = rec.taker or {}
    if taker.get("pid") and _holder_gone(taker):
        return f"{rec.holder} took the workspace but its process (pid {taker.get('pid')} on {taker.get('host')}) is gone"
    return None
