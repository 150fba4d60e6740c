"""The workspace verbs: run, resume, suspend, list, show, logs.

Each verb reads the record from the repository, checks what the state allows, takes the
authority when it is going to run something (``authority.take``), and records what happened
as events. ``ops`` wraps these for the front ends.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sojourn.workspace import records as R
from sojourn.workspace.authority import reap, take
from sojourn.workspace.capsules import check_capsule_owner, record_python
from sojourn.workspace.errors import WorkspaceError
from sojourn.workspace.liveness import boot_id, hostname, me, process_start
from sojourn.workspace.logs import LogRecord, allocation_records, read_log
from sojourn.workspace.machine import MachineSpec
from sojourn.workspace.requests import RequestFollower
from sojourn.workspace.store import WorkspaceStore
from sojourn.workspace.supervisor import Outcome, SessionSpec, Supervisor

StartCallback = Callable[["SessionStart"], None]
ProgressCallback = Callable[[str, dict[str, Any]], None]

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)


def parse_size(text: str | int | None) -> int | None:
    """``"512MiB"``, ``"2G"``, ``"1.5GB"`` or a byte count; K/M/G/T are powers of 1024."""
    if text is None or isinstance(text, int):
        return text
    m = _SIZE.match(str(text))
    if not m:
        raise WorkspaceError(f"cannot read the size {text!r}: write e.g. 512MiB, 2G or 1073741824")
    power = " kmgt".index(m.group(2).lower() or " ")
    return int(float(m.group(1)) * (1024**power))


@dataclass
class SessionStart:
    workspace: str
    name: str
    allocation: str
    epoch: int
    capsule: str | None  # resumed from
    machine: str | None = None  # a configured machine (`--on`), with its scratch directory
    scratch: str | None = None


@dataclass
class SessionResult:
    workspace: str
    name: str
    allocation: str
    state: str
    reason: str
    exit_code: int
    detail: str
    capsule: R.CapsuleEntry | None
    next_action: R.NextAction

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class SuspendResult:
    workspace: str
    allocation: str
    capsule: R.CapsuleEntry
    reason: str
    seconds: float
    waited: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class WorkspaceRow:
    """One line of ``sojourn ps``."""

    id: str
    name: str
    state: str
    where: str
    last_capsule: str | None
    size: int
    updated: float
    stop_reason: str | None
    allocations: int
    spend: float = 0.0  # every allocation's, USD

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _interpreter(python: str | None) -> str:
    if python is None:
        return sys.executable
    found = shutil.which(python) if os.sep not in python else (python if os.access(python, os.X_OK) else None)
    if not found:
        raise WorkspaceError(f"no Python interpreter {python!r}: give a path or a command on PATH")
    return os.path.abspath(found)


def _allocation(al: str, epoch: int, python: str, memory: int | None, capsule_in: str | None,
                max_duration: float | None = None) -> R.Allocation:
    host = hostname()
    started = R.now()
    return R.Allocation(id=al, provider="local", machine=host, host=host, boot_id=boot_id(), pid=os.getpid(),
                        pid_start=process_start(os.getpid()), python=python, memory_limit=memory,
                        started=started, epoch=epoch, capsule_in=capsule_in,
                        hard_stop=started + max_duration if max_duration else None)


def _no_overrides(python: str | None, memory: int | None) -> None:
    if python is not None or memory is not None:
        raise WorkspaceError("--python and --memory set the session of a run without --on; a machine (--on) has "
                             "its own interpreter and memory limit: change them with `sojourn machines set`")


def _result(store: WorkspaceStore, start: SessionStart, out: Outcome) -> SessionResult:
    rec = store.record(start.workspace, save=False)
    return SessionResult(start.workspace, start.name, start.allocation, out.state, out.reason, out.exit_code,
                         out.detail, out.capsule, rec.next_action)


result_of = _result


def run(store: WorkspaceStore, script: str, argv: list[str], *, name: str | None = None, python: str | None = None,
        cwd: str | None = None, memory: int | None = None, on_output: Any = None,
        on_start: StartCallback | None = None, scan_interval: float = 600.0,
        machine: MachineSpec | None = None, max_duration: float | None = None) -> SessionResult:
    """Create a workspace and run ``script`` in it, in the foreground, until it ends or pauses.
    With ``machine``, the session runs in the machine's scratch directory, on a copy of the
    working directory's files, with its interpreter and limits (``onmachine.py``)."""
    if machine is not None:
        from sojourn.workspace import onmachine

        _no_overrides(python, memory)
        p = onmachine.prepare_run(store, script, argv, machine=machine, name=name, cwd=cwd)
        return onmachine.attach(store, p, on_output=on_output, on_start=on_start,  # type: ignore[no-any-return]
                                scan_interval=scan_interval)
    if store.repo.url.startswith("memory://"):
        raise WorkspaceError("a memory:// repository lives inside one process, and a session runs in its own: "
                             "use a directory or s3://bucket/prefix")
    workdir = os.path.abspath(cwd or os.getcwd())
    if not (Path(workdir) / script).is_file():
        raise WorkspaceError(f"no script {script!r} in {workdir}")
    interp = _interpreter(python)
    command = R.Command(script=script, argv=list(argv), cwd=workdir, python=interp)
    meta = store.create(command, name, default_name=Path(script).stem, creator=me())
    ws, al = meta["id"], R.new_id("al")
    rec = R.initial(meta)
    store.append(ws, 0, al, {"type": "created", "name": meta["name"], "command": meta["command"]})
    epoch = take(store, rec, al, "run")
    store.append(ws, epoch, al, {"type": "allocation",
                                 "allocation": asdict(_allocation(al, epoch, interp, memory, None, max_duration))})
    store.record(ws)
    start = SessionStart(ws, meta["name"], al, epoch, None)
    if on_start is not None:
        on_start(start)
    spec = SessionSpec(ws, al, epoch, interp, workdir, script=script, argv=list(argv), memory=memory,
                       scan_interval=scan_interval, hard_stop=max_duration)
    return _result(store, start, Supervisor(store, spec, on_output=on_output).run())


def resume(store: WorkspaceStore, ref: str, *, python: str | None = None, cwd: str | None = None,
           memory: int | None = None, on_output: Any = None, on_start: StartCallback | None = None,
           scan_interval: float = 600.0, machine: MachineSpec | None = None,
           max_duration: float | None = None) -> SessionResult:
    """Carry a suspended (or failed) workspace on from its last good capsule, in a new
    process in the foreground (with ``machine``: in a new scratch directory of that machine,
    with the capsule's files)."""
    if machine is not None:
        from sojourn.workspace import onmachine

        _no_overrides(python, memory)
        p = onmachine.prepare_resume(store, ref, machine=machine)
        return onmachine.attach(store, p, on_output=on_output, on_start=on_start,  # type: ignore[no-any-return]
                                scan_interval=scan_interval)
    ws = store.resolve(ref)
    rec = reap(store, store.record(ws), by="sojourn resume")
    check_resumable(rec)
    check_capsule(store, rec)
    al = R.new_id("al")
    epoch = take(store, rec, al, "resume")
    # The capsule as of our authority event is the one to carry on from (winning the swap
    # means nothing else changed the workspace since the record we checked).
    rec = store.record(ws)
    assert rec.holder == al and rec.last_capsule is not None, "the record changed under a won epoch"
    cap = rec.last_capsule.id
    interp = _interpreter(python) if python else _default_python(rec)
    workdir = os.path.abspath(cwd) if cwd else (rec.command.cwd if os.path.isdir(rec.command.cwd) else os.getcwd())
    store.append(ws, epoch, al, {"type": "allocation",
                                 "allocation": asdict(_allocation(al, epoch, interp, memory, cap, max_duration))})
    store.record(ws)
    start = SessionStart(ws, rec.name, al, epoch, cap)
    if on_start is not None:
        on_start(start)
    spec = SessionSpec(ws, al, epoch, interp, workdir, capsule=cap, memory=memory, scan_interval=scan_interval,
                       hard_stop=max_duration)
    return _result(store, start, Supervisor(store, spec, on_output=on_output).run())


def _default_python(rec: R.WorkspaceRecord) -> str:
    """The interpreter the workspace last ran with, if its record is signed and this host has it."""
    return record_python(rec)


def check_capsule(store: WorkspaceStore, rec: R.WorkspaceRecord) -> None:
    """Before anything is taken or run: the capsule to resume from is this workspace's (or,
    in a signed fork, its origin's)."""
    assert rec.last_capsule is not None
    first = store.event(rec.id, 1) or {}
    check_capsule_owner(store.repo, rec, rec.last_capsule.id, forked=bool(first.get("forked_from")))


def check_resumable(rec: R.WorkspaceRecord) -> None:
    if rec.state == "running":
        a = rec.current
        where = f" on {a.host} (pid {a.pid})" if a else ""
        raise WorkspaceError(f"workspace {rec.id} is running{where}; `sojourn suspend {rec.id}` pauses it first")
    if rec.state == "finished":
        raise WorkspaceError(f"workspace {rec.id} has finished; there is nothing to resume")
    if rec.last_capsule is None:
        raise WorkspaceError(f"workspace {rec.id} has no capsule that passed its write check ({rec.state}: "
                             f"{rec.detail or rec.stop_reason}); run the script again")


def suspend(store: WorkspaceStore, ref: str, *, deadline: float | None = 600.0, wait: float | None = None,
            on_progress: ProgressCallback | None = None) -> SuspendResult:
    """Ask the running session to pause; return once its capsule is written and checked and
    its process has exited. ``deadline``: seconds the session may take to reach a statement
    where it can pause (then the pause is given up and it keeps running); ``wait``: seconds
    this call waits (None: until the session answers)."""
    ws = store.resolve(ref)
    rec = reap(store, store.record(ws), by="sojourn suspend")
    if rec.state != "running" or rec.current is None:
        cap = rec.last_capsule.id if rec.last_capsule else "none"
        raise WorkspaceError(f"workspace {ws} is not running ({rec.state}; last capsule {cap})")
    a = rec.current
    n = store.request(ws, rec.epoch, "suspend", deadline=deadline)
    follow = RequestFollower(store, rec, n, kind=None, verb="suspend", wait=wait, on_progress=on_progress)
    capsule: R.CapsuleEntry | None = None
    for ev in follow:
        kind = ev.get("type")
        if kind == "capsule":
            capsule = R.CapsuleEntry(**ev["capsule"])
        elif kind == "stopped" and ev.get("allocation") == a.id:
            if capsule is not None and capsule.verified and ev.get("state") == "suspended":
                return SuspendResult(ws, a.id, capsule, str(ev.get("reason")), follow.elapsed(), follow.waited)
            raise WorkspaceError(f"workspace {ws} stopped without a good capsule ({ev.get('reason')}: "
                                 f"{ev.get('detail')}); state {ev.get('state')}")
    raise AssertionError("unreachable: RequestFollower only ends by raising")


def rows(store: WorkspaceStore) -> list[WorkspaceRow]:
    """``sojourn ps``: every workspace, newest first, with dead holders on this host reaped."""
    out = []
    for rec in store.records():
        rec = reap(store, rec, by="sojourn ps")
        out.append(row(rec))
    out.sort(key=lambda r: r.updated, reverse=True)
    return out


def row(rec: R.WorkspaceRecord) -> WorkspaceRow:
    a = rec.current if rec.state == "running" else rec.last_allocation
    if a is None:
        where = "-"
    elif rec.state == "running":
        where = f"{a.provider}:{a.machine} pid {a.session_pid or a.pid}"
    else:
        where = f"{a.provider}:{a.machine}"
    cap = rec.last_capsule
    return WorkspaceRow(rec.id, rec.name, rec.state, where, cap.id if cap else None, cap.size if cap else 0,
                        rec.updated, rec.stop_reason, len(rec.allocations),
                        round(sum(x.spend for x in rec.allocations), 6))


def show(store: WorkspaceStore, ref: str) -> tuple[R.WorkspaceRecord, list[dict[str, Any]]]:
    ws = store.resolve(ref)
    rec = reap(store, store.record(ws), by="sojourn show")
    events = store.events(ws)
    epoch = 0
    for ev in events:  # mark what the fold ignored
        ev["stale"] = int(ev.get("epoch", 0)) < epoch
        if ev.get("type") == "authority" and not ev["stale"]:
            epoch = int(ev.get("epoch", 0))
    return rec, events


def logs(store: WorkspaceStore, ref: str) -> tuple[R.WorkspaceRecord, list[LogRecord]]:
    ws = store.resolve(ref)
    rec = store.record(ws)
    return rec, read_log(store.backend, rec)


def follow(store: WorkspaceStore, ref: str, interval: float = 0.5) -> Iterator[LogRecord]:
    """The log as it grows, until the workspace is no longer running."""
    ws = store.resolve(ref)
    seen: dict[str, int] = {}
    while True:
        rec = reap(store, store.record(ws), by="sojourn logs")
        for a in rec.allocations:
            for seq, r in allocation_records(store.backend, ws, a.id, seen.get(a.id, 0)):
                seen[a.id] = seq
                yield r
        if rec.state != "running":
            return
        time.sleep(interval)
