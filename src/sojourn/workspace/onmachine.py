"""Sessions on a machine: ``sojourn run --on MACHINE`` and ``sojourn resume WS --on MACHINE``.

A run on a machine happens in two steps, so that the same code serves a foreground run (the
``sojourn`` command is the supervisor) and a detached one (a provider starts
``python -m sojourn.workspace.supervise`` on the machine):

1. :func:`prepare_run` / :func:`prepare_resume`, where the command is typed: the working
   directory's files go into the repository (a files-only capsule named by a ``files``
   event), the workspace takes its epoch for the new allocation;
2. :func:`attach`, on the machine, in the supervisor's process: the ``allocation`` event
   (naming this process, the offer, the scratch directory, the hard stop), the files
   materialized in the scratch directory (small files first), then the supervisor runs the
   session there with the machine's interpreter and limits.

Between the two, the taker of the epoch (the command) stays alive until the allocation event
is there (:func:`wait_attached`), so that a reaper never mistakes a starting workspace for a
dead one.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sojourn.errors import SojournError
from sojourn.workspace import events as E
from sojourn.workspace import files
from sojourn.workspace import records as R
from sojourn.workspace.authority import reap, take
from sojourn.workspace.errors import WorkspaceError
from sojourn.workspace.liveness import boot_id, hostname, me, process_start
from sojourn.workspace.machine import MachineSpec
from sojourn.workspace.store import WorkspaceStore
from sojourn.workspace.supervisor import SessionSpec, Supervisor


@dataclass
class Prepared:
    """A workspace whose epoch is taken for ``allocation`` on ``machine``; nothing runs yet."""

    workspace: str
    name: str
    allocation: str
    epoch: int
    machine: MachineSpec
    capsule: str | None = None  # resumed from

    @property
    def scratch(self) -> Path:
        return self.machine.scratch_for(self.allocation)


def _check_repo(store: WorkspaceStore) -> None:
    if store.repo.url.startswith("memory://"):
        raise WorkspaceError("a memory:// repository lives inside one process, and a session runs in its own: "
                             "use a directory or s3://bucket/prefix")


def prepare_run(store: WorkspaceStore, script: str, argv: list[str], *, machine: MachineSpec,
                name: str | None = None, cwd: str | None = None) -> Prepared:
    """Create the workspace, copy the working directory's files into the repository, and
    take epoch 1 for a new allocation on ``machine``."""
    _check_repo(store)
    workdir = os.path.abspath(cwd or os.getcwd())
    path = Path(workdir) / script
    if not path.is_file():
        raise WorkspaceError(f"no script {script!r} in {workdir}")
    rel = os.path.relpath(path.resolve(), Path(workdir).resolve())
    if rel.startswith(".."):
        raise WorkspaceError(f"the script {script!r} is outside {workdir}: on a machine the session runs in a copy "
                             "of the working directory, so run from a directory that holds the script")
    snap = files.snapshot(store.repo, workdir, workspace=None)
    command = R.Command(script=rel, argv=list(argv), cwd=workdir, python=machine.python)
    meta = store.create(command, name, default_name=Path(script).stem, creator=me())
    ws, al = meta["id"], R.new_id("al")
    store.append(ws, 0, al, {"type": "created", "name": meta["name"], "command": meta["command"]})
    epoch = take(store, R.initial(meta), al, "run")
    store.append(ws, epoch, al, snap.event(al))
    return Prepared(ws, meta["name"], al, epoch, machine)


def prepare_resume(store: WorkspaceStore, ref: str, *, machine: MachineSpec) -> Prepared:
    """Take the next epoch of a suspended (or failed) workspace for an allocation on
    ``machine``. Its files come from the capsule it resumes from; a capsule written without
    files (a run not on a machine) takes the workspace's last snapshot, or a new one of its
    directory."""
    from sojourn.workspace.sessions import check_capsule, check_resumable

    _check_repo(store)
    ws = store.resolve(ref)
    rec = reap(store, store.record(ws), by="sojourn resume")
    check_resumable(rec)
    check_capsule(store, rec)
    assert rec.last_capsule is not None
    snap = None
    if files.source_for_resume(store.repo, rec, rec.last_capsule.id) is None:
        if not os.path.isdir(rec.command.cwd):
            raise WorkspaceError(f"capsule {rec.last_capsule.id} carries no files, and the workspace's directory "
                                 f"{rec.command.cwd} is not on this host: resume it without --on where it is")
        snap = files.snapshot(store.repo, rec.command.cwd, workspace=ws)
    al = R.new_id("al")
    epoch = take(store, rec, al, "resume")
    rec = store.record(ws)
    assert rec.holder == al and rec.last_capsule is not None, "the record changed under a won epoch"
    if snap is not None:
        store.append(ws, epoch, al, snap.event(al))
    return Prepared(ws, rec.name, al, epoch, machine, rec.last_capsule.id)


def handle_of(p: Prepared, scratch: Path) -> dict[str, Any]:
    """The provider handle of this process as the allocation's supervisor (JSON of
    ``providers.base.Handle``): what ``status``/``terminate`` need, from any process."""
    pid = os.getpid()
    data: dict[str, Any] = {"host": hostname(), "boot_id": boot_id(), "pid": pid, "pid_start": process_start(pid),
                            "scratch": str(scratch)}
    if p.machine.provider == "slurm" and os.environ.get("SLURM_JOB_ID"):  # issue 6: the batch job it runs in
        data["job_id"] = os.environ["SLURM_JOB_ID"]
    return {"provider": p.machine.provider, "machine": p.machine.name, "allocation": p.allocation, "data": data}


def attach(store: WorkspaceStore, p: Prepared, *, on_output: Any = None,
           on_start: Callable[[Any], None] | None = None, scan_interval: float = 600.0) -> Any:
    """Be the supervisor of ``p``'s allocation in this process: record it, put the files in
    the scratch directory, run the session there until it ends or pauses (a SessionResult)."""
    from sojourn.workspace.sessions import SessionStart, result_of

    m = p.machine
    scratch = p.scratch
    scratch.mkdir(parents=True, exist_ok=True)
    started = R.now()
    pid = os.getpid()
    offer = m.offer or {"provider": m.provider, "name": m.name, "price_per_hour": m.price_per_hour}
    alloc = R.Allocation(id=p.allocation, provider=m.provider, machine=m.name, host=hostname(), boot_id=boot_id(),
                         pid=pid, pid_start=process_start(pid), python=m.python, memory_limit=m.memory,
                         started=started, epoch=p.epoch, capsule_in=p.capsule, price_per_hour=m.price_per_hour,
                         offer=offer, scratch=str(scratch),
                         hard_stop=started + m.max_duration if m.max_duration else None, handle=handle_of(p, scratch))
    store.append(p.workspace, p.epoch, p.allocation, {"type": "allocation", "allocation": asdict(alloc)})
    rec = store.record(p.workspace)
    start = SessionStart(p.workspace, p.name, p.allocation, p.epoch, p.capsule, machine=m.name, scratch=str(scratch))
    if on_start is not None:
        on_start(start)
    script = None if p.capsule else rec.command.script
    spec = SessionSpec(p.workspace, p.allocation, p.epoch, m.python, str(scratch), script=script,
                       argv=list(rec.command.argv) if script else [], capsule=p.capsule, memory=m.memory,
                       scan_interval=scan_interval, cpus=m.cpus, hard_stop=m.max_duration,
                       price_per_hour=m.price_per_hour, files=True)
    sup = Supervisor(store, spec, on_output=on_output)
    sup.t0 = started  # the allocation's time (spend, hard stop) includes copying its files
    try:
        source = (files.source_for_resume(store.repo, rec, p.capsule) if p.capsule
                  else str((rec.files or {}).get("capsule") or "") or None)
        if source is not None:
            files.materialize(store.repo, source, scratch)
    except (SojournError, OSError) as e:
        return result_of(store, start, sup._finish_without_session(f"the files could not be put in {scratch}: {e}"))
    return result_of(store, start, sup.run())


def abandon(store: WorkspaceStore, p: Prepared, why: str) -> None:
    """Close an allocation that never started (its launch failed): the workspace stands where
    it was, on the capsule it would have resumed from."""
    rec = store.record(p.workspace, save=False)
    standing = p.capsule or (rec.last_capsule.id if rec.last_capsule else None)
    store.append(p.workspace, p.epoch, p.allocation, E.stop(p.allocation, "failed", why, standing=standing, ran=False))
    store.record(p.workspace)


def wait_attached(store: WorkspaceStore, p: Prepared, ended: Callable[[], str | None],
                  timeout: float = 120.0) -> R.Allocation:
    """Wait until the detached supervisor recorded its allocation. ``ended()`` says why the
    launched process is gone (None while it runs); then the allocation is closed as failed."""
    deadline = time.monotonic() + timeout
    while True:
        why = ended()  # asked first: an allocation recorded just before the end still counts
        a = store.record(p.workspace, save=False).allocation(p.allocation)
        if a is not None:
            return a
        if why is not None or time.monotonic() > deadline:
            why = why or f"it did not record its allocation within {timeout:g} s"
            abandon(store, p, f"the supervisor on {p.machine.name} did not start: {why}")
            raise WorkspaceError(f"workspace {p.workspace}: the supervisor on machine {p.machine.name} did not "
                                 f"start: {why}")
        time.sleep(0.05)
