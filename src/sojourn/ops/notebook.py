"""Kernel workspaces: a Jupyter kernel is a workspace like a script run, with the same store,
records and authority (docs/notebooks.md).

Events a kernel writes (all ordinary workspace events, so ``sojourn show``/``ps``/``history``
read them unchanged): ``created`` (a note naming the notebook), ``authority``,
``allocation`` (provider ``local``, the machine, the kernel's pid), ``started``, ``capsule``
(reason ``checkpoint``, ``autosave``, ``move``, ``fork``, ``suspend``), ``stopped`` (reason
``moved`` when the kernel went to another machine, ``suspended``, ``finished`` at shutdown).
A fork is a new workspace whose first event is a ``note`` with ``forked_from`` and whose
first capsule is the fork point: it shares every chunk with its parent.
"""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import dataclass
from typing import Any

from sojourn.repository.repo import open_repository
from sojourn.workspace import records as R
from sojourn.workspace.authority import take
from sojourn.workspace.liveness import boot_id, hostname, process_start
from sojourn.workspace.store import WorkspaceStore

PathLike = str | os.PathLike[str]


@dataclass
class KernelSession:
    """Who this kernel is in the repository: its workspace, epoch and allocation."""

    repo: str
    workspace: str
    name: str
    epoch: int
    allocation: str
    machine: str
    last_capsule: str | None = None

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _allocation(al: str, epoch: int, machine: str, capsule_in: str | None, memory: int | None) -> dict[str, Any]:
    pid = os.getpid()
    return R.Allocation(
        id=al, provider="local", machine=machine, host=hostname(), boot_id=boot_id(), pid=pid,
        pid_start=process_start(pid), python=sys.executable, memory_limit=memory, started=R.now(),
        epoch=epoch, capsule_in=capsule_in, session_pid=pid, session_pid_start=process_start(pid),
        python_version=platform.python_version(),
    ).__dict__


def _start(store: WorkspaceStore, rec: R.WorkspaceRecord, machine: str, capsule_in: str | None,
           memory: int | None, reason: str) -> tuple[int, str]:
    al = R.new_id("al")
    epoch = take(store, rec, al, reason)
    store.append(rec.id, epoch, al,
                 {"type": "allocation", "allocation": _allocation(al, epoch, machine, capsule_in, memory)},
                 {"type": "started", "allocation": al, "session_pid": os.getpid(),
                  "session_pid_start": process_start(os.getpid()),
                  "python_version": platform.python_version(), "python": platform.python_version(),
                  "arch": platform.machine(), "platform": sys.platform})
    return epoch, al


def open_kernel(repo: PathLike | None, *, notebook: str | None, machine: str = "local",
                name: str | None = None, memory: int | None = None) -> KernelSession:
    """A new workspace for a kernel that starts with an empty namespace."""
    with open_repository(repo, create=True) as r:
        store = WorkspaceStore(r)
        stem = os.path.splitext(os.path.basename(notebook))[0] if notebook else "notebook"
        cmd = R.Command(script=notebook or "<kernel>", argv=[], cwd=os.getcwd(), python=sys.executable)
        meta = store.create(cmd, name, default_name=stem or "notebook",
                            creator={"host": hostname(), "boot_id": boot_id(), "pid": os.getpid(),
                                     "pid_start": process_start(os.getpid())})
        ws = meta["id"]
        store.append(ws, 0, "kernel", {"type": "created", "name": meta["name"], "command": cmd.__dict__,
                                       "kind": "kernel", "notebook": notebook})
        epoch, al = _start(store, store.record(ws), machine, None, memory, "kernel started")
        return KernelSession(r.url, ws, meta["name"], epoch, al, machine)


def record_capsule(sess: KernelSession, ref: Any, reason: str, where: str, *, verified: bool = True,
                   error: str | None = None) -> None:
    """A ``capsule`` event. ``verified`` here means the write check of a kernel capsule:
    the manifest reads back signed and every chunk it names is present (a full restore in a
    fresh interpreter is what a move or ``%sojourn verify`` does)."""
    with open_repository(sess.repo) as r:
        entry = R.CapsuleEntry(id=ref.id, parent=ref.parent, reason=reason, where=where, size=int(ref.size),
                               time=R.now(), allocation=sess.allocation, verified=verified, error=error)
        WorkspaceStore(r).append(sess.workspace, sess.epoch, sess.allocation,
                                 {"type": "capsule", "capsule": entry.__dict__})
    if verified:
        sess.last_capsule = ref.id


def record_stop(sess: KernelSession, reason: str, *, capsule: str | None = None, detail: str = "") -> None:
    with open_repository(sess.repo) as r:
        state = R.state_after_stop(reason, capsule)
        WorkspaceStore(r).append(sess.workspace, sess.epoch, sess.allocation,
                                 {"type": "stopped", "allocation": sess.allocation, "reason": reason,
                                  "detail": detail, "exit_code": 0, "state": state, "capsule": capsule})


def holds(sess: KernelSession) -> bool:
    """Whether this kernel still holds its workspace (nobody took the next epoch)."""
    with open_repository(sess.repo) as r:
        return WorkspaceStore(r).holds(sess.workspace, sess.epoch)


def take_over(repo: PathLike | None, workspace: str, *, capsule: str, machine: str, moved_from: str | None,
              memory: int | None = None) -> KernelSession:
    """The destination of a move (or a resume) takes the workspace: the next epoch, a new
    allocation that starts from ``capsule``, and the end of the source's allocation
    (``moved``) when there was one. Fenced: the source's later writes are void."""
    with open_repository(repo) as r:
        store = WorkspaceStore(r)
        ws = store.resolve(workspace)
        rec = store.record(ws)
        old = rec.current
        reason = f"moved from {moved_from}" if moved_from else "resumed"
        epoch, al = _start(store, rec, machine, capsule, memory, reason)
        if old is not None:
            store.append(ws, epoch, al, {"type": "stopped", "allocation": old.id, "reason": "moved",
                                         "detail": f"moved to {machine}", "exit_code": 0,
                                         "state": "running", "capsule": capsule})
        return KernelSession(r.url, ws, rec.name, epoch, al, machine, capsule)


def last_capsule(repo: PathLike | None, workspace: str) -> tuple[str, str | None]:
    """(workspace id, its last good capsule)."""
    with open_repository(repo) as r:
        store = WorkspaceStore(r)
        ws = store.resolve(workspace)
        rec = store.record(ws)
        return ws, rec.last_capsule.id if rec.last_capsule else None


def suspended_for_notebook(repo: PathLike | None, notebook: str | None) -> str | None:
    """The workspace of ``notebook`` (named after it, as :func:`open_kernel` names it) when it
    is suspended at a capsule: a kernel opened again for that notebook resumes it."""
    if not notebook:
        return None
    stem = os.path.splitext(os.path.basename(notebook))[0]
    with open_repository(repo, create=True) as r:
        store = WorkspaceStore(r)
        try:
            ws = store.resolve(stem)
        except Exception:
            return None  # no such workspace (or the name is ambiguous): start empty
        rec = store.record(ws)
        return ws if rec.state == "suspended" and rec.last_capsule else None


def resume_target(repo: PathLike | None, resume: str, notebook: str | None) -> tuple[str | None, str | None]:
    """What a kernel started with ``resume`` (a capsule, a workspace, or "notebook": the
    suspended workspace of ``notebook``) starts from: (workspace id or None, capsule or None)."""
    if resume == "notebook":
        resume = suspended_for_notebook(repo, notebook) or ""
    if not resume:
        return None, None
    if resume.startswith("cap_"):
        return None, resume
    return last_capsule(repo, resume)


def fork(sess: KernelSession, ref: Any, name: str) -> str:
    """A new workspace whose history starts at ``ref`` (a capsule of ``sess``). Nothing is
    copied: the fork's capsules name the same chunks."""
    with open_repository(sess.repo) as r:
        store = WorkspaceStore(r)
        src = store.meta(sess.workspace)
        cmd = R.Command(**src["command"])
        meta = store.create(cmd, name)
        ws = meta["id"]
        store.append(ws, 0, "fork", {"type": "created", "name": name, "command": cmd.__dict__, "kind": "kernel"},
                     {"type": "note", "message": f"forked from {sess.name} at {ref.id}",
                      "forked_from": {"workspace": sess.workspace, "capsule": ref.id}})
        # The fork point is the fork's first capsule; it is suspended there until a kernel opens it.
        fenced = store.acquire(ws, 0, "fork")
        entry = R.CapsuleEntry(id=ref.id, parent=ref.parent, reason="fork", where=f"fork of {sess.name}",
                               size=int(ref.size), time=R.now(), allocation="fork", verified=True)
        store.append(ws, fenced, "fork", {"type": "authority", "holder": "fork", "reason": "fork"},
                     {"type": "capsule", "capsule": entry.__dict__},
                     {"type": "stopped", "allocation": "fork", "reason": "suspended", "detail": "forked",
                      "exit_code": None, "state": "suspended", "capsule": ref.id})
        store.append(sess.workspace, sess.epoch, sess.allocation,
                     {"type": "note", "message": f"forked as {name} ({ws}) at {ref.id}",
                      "fork": {"workspace": ws, "capsule": ref.id}})
        return ws
