"""The service layer for workspaces: run, resume, suspend, ps, show, logs (see
docs/workspaces.md). The workspace layer is imported on first use: `import sojourn` stays as
cheap as it was."""

from __future__ import annotations

import os
import sys
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from sojourn.repository.repo import open_repository

PathLike = str | os.PathLike[str]

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from sojourn.providers.base import Offer
    from sojourn.workspace.logs import LogRecord
    from sojourn.workspace.machine import MachineSpec
    from sojourn.workspace.onmachine import Prepared
    from sojourn.workspace.records import WorkspaceRecord
    from sojourn.workspace.sessions import (
        SessionResult,
        SessionStart,
        SuspendResult,
        WorkspaceRow,
    )
    from sojourn.workspace.store import WorkspaceStore


@dataclass
class WorkspaceDetail:
    """``show``: the folded record and the event log it came from (``stale`` marks the events
    of a writer that had lost the authority, which the record ignores)."""

    record: WorkspaceRecord
    events: list[dict[str, Any]]
    files: list[dict[str, Any]] = field(default_factory=list)  # the file manifest: path, size, mode, hash

    def to_json(self) -> dict[str, Any]:
        return {**self.record.to_json(), "events": self.events, "file_list": self.files}


@dataclass
class WorkspaceLog:
    """``logs``: the workspace's output across every allocation, in order."""

    workspace: str
    state: str
    records: list[LogRecord]

    def text(self, stream: str | None = None) -> str:
        return "".join(r.text for r in self.records if stream is None or r.stream == stream)

    def to_json(self) -> dict[str, Any]:
        return {"workspace": self.workspace, "state": self.state,
                "records": [{"allocation": r.allocation, "stream": r.stream, "text": r.text} for r in self.records]}


class _Workspaces:
    """Opens the repository and the workspace store for one call."""

    def __init__(self, repo: PathLike | None, create: bool = False):
        self.repo_arg = repo
        self.create = create

    def __enter__(self) -> WorkspaceStore:
        from sojourn.workspace.store import WorkspaceStore

        self.repo = open_repository(self.repo_arg, create=self.create)
        return WorkspaceStore(self.repo)

    def __exit__(self, *exc: object) -> None:
        self.repo.close()


def run(
    script: str,
    args: list[str] | tuple[str, ...] = (),
    *,
    repo: PathLike | None = None,
    name: str | None = None,
    python: str | None = None,
    cwd: PathLike | None = None,
    memory: int | str | None = None,
    on_output: Callable[[str, bytes], None] | None = None,
    on_start: Callable[[SessionStart], None] | None = None,
    scan_interval: float = 600.0,
    on: str | None = None,
    max_duration: str | float | None = None,
    detach: bool = False,
) -> SessionResult | DetachedSession:
    """Run ``script`` with ``args`` as ``__main__`` in a new workspace, in a session process
    (under ``python``, with an optional memory limit), until it finishes or pauses.
    ``on_output(stream, bytes)`` receives the program's output as it comes.

    ``on``: a machine of the repository's machines config: the session runs in its scratch
    directory on a copy of the working directory's files, with its interpreter and limits.
    ``max_duration`` (``"2h"``, seconds): the hard stop, after which the session is suspended.
    ``detach``: the supervisor runs in the background on the machine (default ``local``); the
    call returns a :class:`DetachedSession` once it has recorded its allocation."""
    from sojourn.workspace import sessions
    from sojourn.workspace.machine import parse_duration

    limit = parse_duration(max_duration)
    with _Workspaces(repo, create=True) as store:
        found = _machine(store, on or "local", limit, python, memory) if (detach or on) else None
        if found is not None and (detach or found[0].provider != "local"):  # slurm, ssh: through the provider
            from sojourn.workspace import onmachine

            machine, offer = found
            p = onmachine.prepare_run(store, script, list(args), machine=machine, name=name,
                                      cwd=os.fspath(cwd) if cwd is not None else None)
            return _launch(store, p, offer)
        spec = found[0] if found is not None else None
        return sessions.run(store, script, list(args), name=name, python=python,
                            cwd=os.fspath(cwd) if cwd is not None else None, memory=sessions.parse_size(memory),
                            on_output=on_output, on_start=_checked(store, found, on_start), scan_interval=scan_interval,
                            machine=spec, max_duration=limit)


def resume(
    workspace: str,
    *,
    repo: PathLike | None = None,
    python: str | None = None,
    cwd: PathLike | None = None,
    memory: int | str | None = None,
    on_output: Callable[[str, bytes], None] | None = None,
    on_start: Callable[[SessionStart], None] | None = None,
    scan_interval: float = 600.0,
    on: str | None = None,
    max_duration: str | float | None = None,
    detach: bool = False,
    build_env: bool = False,
    env_mode: str = "exact",
) -> SessionResult | DetachedSession:
    """Carry a suspended workspace on from its last good capsule in a new session process.

    ``on``: a machine (see :func:`run`); without it, a workspace that last ran on a machine of
    the config goes back to that machine, and any other resumes where it ran.
    ``build_env``: an interpreter without the capsule's libraries gets an environment built
    for it first (uv, cached by the environment's hash; docs/environment.md); without it,
    such an interpreter is refused naming what is missing, before the session starts."""
    from sojourn.workspace import sessions
    from sojourn.workspace.machine import parse_duration

    limit = parse_duration(max_duration)
    with _Workspaces(repo) as store:
        if on is None and python is None and memory is None:
            on = _last_machine(store, workspace)
        found = _machine(store, on or "local", limit, python, memory) if (detach or on) else None
        if found is not None and (detach or found[0].provider != "local"):  # slurm, ssh: through the provider
            from sojourn.workspace import onmachine

            machine, offer = found
            return _launch(store, onmachine.prepare_resume(store, workspace, machine=machine), offer)
        spec = found[0] if found is not None else None
        if spec is not None and spec.python and (build_env or spec.python != sys.executable):
            spec = replace(spec, python=_environment(store, workspace, spec.python, build_env, env_mode) or spec.python)
        elif spec is None and (python is not None or build_env):
            python = _environment(store, workspace, python, build_env, env_mode)
        return sessions.resume(store, workspace, python=python, cwd=os.fspath(cwd) if cwd is not None else None,
                               memory=sessions.parse_size(memory), on_output=on_output,
                               on_start=_checked(store, found, on_start),
                               scan_interval=scan_interval, machine=spec, max_duration=limit)


def _environment(store: WorkspaceStore, workspace: str, python: str | None, build_env: bool, mode: str) -> str | None:
    """The interpreter a resume runs with, checked against the last capsule's needs (or built
    for them): the one place a resume meets sojourn.environment."""
    from sojourn.ops.environment import prepare_python
    from sojourn.workspace.sessions import _default_python

    rec = store.record(store.resolve(workspace), save=False)
    if rec.last_capsule is None:
        return python
    target = python if python is not None else _default_python(rec)
    return prepare_python(store.repo, rec.last_capsule.id, target, build_env=build_env, mode=mode)


@dataclass
class DetachedSession:
    """``run``/``resume`` with ``detach``: the supervisor runs in the background on a machine;
    ``sojourn logs -f`` follows it, ``sojourn suspend`` pauses it."""

    workspace: str
    name: str
    allocation: str
    machine: str
    capsule: str | None  # resumed from
    handle: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _machine(store: WorkspaceStore, on: str, limit: float | None, python: str | None,
             memory: int | str | None) -> tuple[MachineSpec, Offer]:
    from sojourn.ops.machines import machine_for
    from sojourn.workspace.errors import WorkspaceError

    if python is not None or memory is not None:
        raise WorkspaceError("--python and --memory set the session of a run without --on; a machine has its own "
                             "interpreter and memory limit: change them with `sojourn machines set`")
    return machine_for(store.repo, on, limit)


def _checked(store: WorkspaceStore, found: tuple[MachineSpec, Offer] | None,
             on_start: Callable[[SessionStart], None] | None) -> Callable[[SessionStart], None] | None:
    """Issue 6: a foreground session on a machine records its four launch checks once its
    allocation is there (the supervisor is this process: launched and reachable)."""
    if found is None:
        return on_start

    def started(start: SessionStart) -> None:
        from sojourn.ops.policy import check_events

        store.append(start.workspace, start.epoch, start.allocation,
                     *check_events(found[1], start.workspace, start.allocation, listed=True, launched=True,
                                   launch=f"foreground supervisor, pid {os.getpid()}"))
        if on_start is not None:
            on_start(start)

    return started


def _last_machine(store: WorkspaceStore, workspace: str) -> str | None:
    """The machine the workspace last ran on, when it is still in the config."""
    from sojourn.providers.machines import has_config, load_machines

    rec = store.record(store.resolve(workspace), save=False)
    a = rec.last_allocation
    if a is None or a.scratch is None:
        return None
    if a.machine in load_machines(store.repo) and (has_config(store.repo) or a.machine == "local"):
        return a.machine
    return None


def _launch(store: WorkspaceStore, p: Prepared, offer: Offer) -> DetachedSession:
    """Start ``p``'s supervisor through the machine's provider; return once it recorded its
    allocation (a launch that fails closes the allocation and leaves the workspace as it was)."""
    from sojourn.providers.base import LaunchFailed, LaunchSpec, get_provider
    from sojourn.workspace import onmachine
    from sojourn.workspace.supervise import supervise_argv

    provider = get_provider(p.machine.provider, store.repo)
    argv = supervise_argv(store.repo.url, p.workspace, p.allocation, p.epoch, p.machine, p.capsule)
    # Issue 6: the four checks (catalog, permission, capacity, launch), each a launch-check event.
    from sojourn.providers.checks import launch_checked

    p.scratch.mkdir(parents=True, exist_ok=True)  # a batch job's --chdir must exist before it starts
    out = launch_checked(provider, offer, LaunchSpec(p.workspace, p.allocation, argv,
                                                     hard_stop=p.machine.max_duration, cwd=str(p.scratch)))
    store.append(p.workspace, p.epoch, p.allocation, *out.events(p.workspace, p.allocation))
    try:
        handle = out.raise_for_failure()
    except LaunchFailed as e:
        onmachine.abandon(store, p, f"the launch failed ({e.check}): {e}")
        raise

    def ended() -> str | None:
        if provider.status(handle) != "ended":
            return None
        return "it exited" + _log_tail(handle)

    a = onmachine.wait_attached(store, p, ended)
    return DetachedSession(p.workspace, p.name, p.allocation, p.machine.name, p.capsule,
                           a.handle or handle.to_json())


def _log_tail(handle: Any) -> str:
    path = handle.data.get("log")
    try:
        with open(path, "rb") as f:
            lines = f.read()[-2000:].decode(errors="replace").strip().splitlines()
    except (OSError, TypeError):
        return ""
    return f": {lines[-1]}" if lines else ""


def suspend(
    workspace: str,
    *,
    repo: PathLike | None = None,
    deadline: float | None = 600.0,
    wait: float | None = None,
    on_progress: Callable[[str, dict[str, Any]], None] | None = None,
) -> SuspendResult:
    """Pause a running workspace; returns once its capsule passed the write check and the
    session exited. Raises ``PauseRefused`` (with the objects' paths) if it cannot pause."""
    from sojourn.workspace import sessions

    with _Workspaces(repo) as store:
        return sessions.suspend(store, workspace, deadline=deadline, wait=wait, on_progress=on_progress)


def ps(repo: PathLike | None = None) -> list[WorkspaceRow]:
    from sojourn.repository.repo import backend_for, resolve_url
    from sojourn.workspace import sessions

    if not backend_for(resolve_url(repo)).exists():
        return []  # nothing was ever run with this repository
    with _Workspaces(repo) as store:
        return sessions.rows(store)


def show(workspace: str, repo: PathLike | None = None) -> WorkspaceDetail:
    from sojourn.workspace import sessions

    with _Workspaces(repo) as store:
        from sojourn.workspace.files import list_files

        rec, events = sessions.show(store, workspace)
        return WorkspaceDetail(rec, events, list_files(store.repo, rec))


def logs(workspace: str, repo: PathLike | None = None) -> WorkspaceLog:
    from sojourn.workspace import sessions

    with _Workspaces(repo) as store:
        rec, records = sessions.logs(store, workspace)
        return WorkspaceLog(rec.id, rec.state, records)


def follow_logs(workspace: str, repo: PathLike | None = None) -> Iterator[LogRecord]:
    """The workspace's log as it grows, until it stops running."""
    from sojourn.workspace import sessions

    with _Workspaces(repo) as store:
        yield from sessions.follow(store, workspace)
