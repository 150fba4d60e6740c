"""The service layer for workspaces: run, resume, suspend, ps, show, logs (see
docs/workspaces.md). The workspace layer is imported on first use: `import sojourn` stays as
cheap as it was."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sojourn.repository.repo import open_repository

PathLike = str | os.PathLike[str]

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from sojourn.workspace.logs import LogRecord
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

    def to_json(self) -> dict[str, Any]:
        return {**self.record.to_json(), "events": self.events}


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
) -> SessionResult:
    """Run ``script`` with ``args`` as ``__main__`` in a new workspace, in a session process
    (under ``python``, with an optional memory limit), until it finishes or pauses.
    ``on_output(stream, bytes)`` receives the program's output as it comes."""
    from sojourn.workspace import sessions

    with _Workspaces(repo, create=True) as store:
        return sessions.run(store, script, list(args), name=name, python=python,
                            cwd=os.fspath(cwd) if cwd is not None else None, memory=sessions.parse_size(memory),
                            on_output=on_output, on_start=on_start, scan_interval=scan_interval)


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
) -> SessionResult:
    """Carry a suspended workspace on from its last good capsule in a new session process."""
    from sojourn.workspace import sessions

    with _Workspaces(repo) as store:
        return sessions.resume(store, workspace, python=python, cwd=os.fspath(cwd) if cwd is not None else None,
                               memory=sessions.parse_size(memory), on_output=on_output, on_start=on_start,
                               scan_interval=scan_interval)


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
        rec, events = sessions.show(store, workspace)
        return WorkspaceDetail(rec, events)


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
