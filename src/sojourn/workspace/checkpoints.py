"""Checkpoints on request: ``sojourn checkpoint WS`` and ``sojourn fork WS --now``.

A checkpoint is a pause whose program carries on: the requester writes a request of kind
``checkpoint`` (``request.<ws>.<epoch>.<n>``, like ``suspend``); the supervisor asks its
session to pause with action ``continue``; the session writes the capsule at the next
statement boundary and runs on. The supervisor then gives the capsule its write check (in a
fresh interpreter, beside the running program) and records it as a ``capsule`` event naming
the request, so that it becomes the workspace's last good capsule: what a crash resumes from,
what ``fork`` starts from.

The check of a capsule that carries the machine's files runs in a directory of its own: it
materializes those files, and the running program's newer writes in the scratch directory
must not be overwritten by the checkpoint's older copies.
"""

from __future__ import annotations

import tempfile
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from sojourn import threads
from sojourn.workspace import records as R
from sojourn.workspace.authority import reap
from sojourn.workspace.capsules import capsule_facts, verify_capsule
from sojourn.workspace.errors import WorkspaceError
from sojourn.workspace.requests import RequestFollower
from sojourn.workspace.store import WorkspaceStore

if TYPE_CHECKING:
    from sojourn.workspace.supervisor import Supervisor


def record_checkpoint(sup: Supervisor, msg: dict[str, Any], n: int | None) -> None:
    """The session wrote a requested checkpoint and runs on: check it and record it, in a
    thread (the pump must keep reading the program's output meanwhile)."""
    # Where no thread can be started (`ulimit -v`), checked here: the output waits meanwhile.
    t = threads.start_or_run(_check_and_record, sup, msg, n, name="sojourn-checkpoint")
    if t is not None:
        sup.background.append(t)


def _check_and_record(sup: Supervisor, msg: dict[str, Any], n: int | None) -> None:
    from sojourn.workspace.files import capsule_files, files_event_of

    s, repo = sup.spec, sup.store.repo
    cap = str(msg["capsule"])
    try:
        has_files = capsule_files(repo, cap) is not None
        if has_files:
            with tempfile.TemporaryDirectory(prefix="sojourn-check-") as tmp:
                error = verify_capsule(sup.repo_url, cap, python=s.python, cwd=tmp)
        else:
            error = verify_capsule(sup.repo_url, cap, python=s.python, cwd=s.cwd)
        entry = R.CapsuleEntry(id=cap, parent=msg.get("parent"), reason=str(msg.get("reason") or "checkpoint"),
                               where=str(msg.get("where", "")), size=int(msg.get("size", 0)), time=R.now(),
                               allocation=s.allocation, verified=error is None, error=error)
        facts = capsule_facts(repo, cap) if error is None else {}
        events: list[dict[str, Any]] = [{"type": "capsule", "capsule": asdict(entry), "request": n,
                                         "checkpoint": True, "distributions": facts.get("distributions"),
                                         "arch": facts.get("arch")}]
        if error is None and s.files and has_files:
            ev = files_event_of(repo, cap, s.allocation, s.cwd)
            if ev is not None:
                events.append(ev)
        sup.append(*events)
    except Exception as e:  # the program runs on; the requester learns it from the log
        try:
            sup.append({"type": "note", "message": f"checkpoint {cap} could not be recorded: {e}", "request": n})
        except Exception:
            pass


@dataclass
class CheckpointResult:
    workspace: str
    allocation: str
    capsule: R.CapsuleEntry
    seconds: float
    waited: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def checkpoint(store: WorkspaceStore, ref: str, *, deadline: float | None = 600.0, wait: float | None = None,
               on_progress: Any = None) -> CheckpointResult:
    """Ask the running session for a checkpoint; return once its capsule passed the write
    check (the program keeps running). Raises ``PauseRefused`` when the pause is refused."""
    ws = store.resolve(ref)
    rec = reap(store, store.record(ws), by="sojourn checkpoint")
    if rec.state != "running" or rec.current is None:
        hint = f"; its last good capsule is {rec.last_capsule.id}" if rec.last_capsule else ""
        raise WorkspaceError(f"workspace {ws} is not running ({rec.state}): a checkpoint needs a running "
                             f"session{hint}")
    a = rec.current
    n = store.request(ws, rec.epoch, "checkpoint", deadline=deadline)
    follow = RequestFollower(store, rec, n, kind="checkpoint", verb="checkpoint", wait=wait, on_progress=on_progress)
    for ev in follow:
        kind = ev.get("type")
        if kind == "capsule" and ev.get("request") == n and ev.get("checkpoint"):
            entry = R.CapsuleEntry(**ev["capsule"])
            if not entry.verified:
                raise WorkspaceError(f"checkpoint {entry.id} of {ws} failed its write check: {entry.error}")
            return CheckpointResult(ws, a.id, entry, follow.elapsed(), follow.waited)
        if kind == "note" and ev.get("request") == n and follow.ours:
            raise WorkspaceError(str(ev.get("message")))
        if kind == "stopped" and ev.get("allocation") == a.id:
            raise WorkspaceError(f"workspace {ws} stopped before its checkpoint was taken ({ev.get('reason')}: "
                                 f"{ev.get('detail')}); state {ev.get('state')}")
    raise AssertionError("unreachable: RequestFollower only ends by raising")
