"""The service layer for forks, capsule history and garbage collection (see
docs/history-and-gc.md). Returns dataclasses; nothing here prints."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sojourn.ops.workspaces import PathLike, _Workspaces

if TYPE_CHECKING:
    from sojourn.workspace.checkpoints import CheckpointResult
    from sojourn.workspace.gc import GcResult
    from sojourn.workspace.history import ForkResult, History


def fork(workspace: str, *, repo: PathLike | None = None, name: str | None = None,
         capsule: str | None = None, now: bool = False, deadline: float | None = 600.0,
         on_progress: Callable[[str, dict[str, Any]], None] | None = None) -> ForkResult:
    """A new workspace that carries on from ``workspace``'s last good capsule (or ``capsule``,
    one of its capsules), suspended: ``resume`` runs it. Both then go their own ways; they
    share every chunk they have in common. ``now``: ask the running ``workspace`` for a
    checkpoint first (see :func:`checkpoint`) and fork from it."""
    from sojourn.workspace.errors import WorkspaceError
    from sojourn.workspace.history import fork as _fork

    with _Workspaces(repo) as store:
        if now:
            from sojourn.workspace.checkpoints import checkpoint as _checkpoint

            if capsule is not None:
                raise WorkspaceError("--now forks from a new checkpoint; --capsule names an existing one: give one")
            capsule = _checkpoint(store, workspace, deadline=deadline, on_progress=on_progress).capsule.id
        return _fork(store, workspace, name=name, capsule=capsule)


def checkpoint(workspace: str, *, repo: PathLike | None = None, deadline: float | None = 600.0,
               wait: float | None = None,
               on_progress: Callable[[str, dict[str, Any]], None] | None = None) -> CheckpointResult:
    """Ask a running workspace for a checkpoint: its session writes a capsule at the next
    statement boundary and keeps running; returns once the capsule passed its write check
    (it is then the workspace's last good capsule). Raises ``PauseRefused`` when refused."""
    from sojourn.workspace.checkpoints import checkpoint as _checkpoint

    with _Workspaces(repo) as store:
        return _checkpoint(store, workspace, deadline=deadline, wait=wait, on_progress=on_progress)


def history(workspace: str, *, repo: PathLike | None = None) -> History:
    """The capsule DAG of ``workspace`` and every workspace forked from it."""
    from sojourn.workspace.history import history as _history

    with _Workspaces(repo) as store:
        return _history(store, workspace)


def gc(*, repo: PathLike | None = None, keep_last: int | None = None, prune_orphans: bool = False,
       dry_run: bool = False, wait: float = 300.0,
       on_progress: Callable[[str, dict[str, Any]], None] | None = None) -> GcResult:
    """Delete every chunk no kept capsule needs (and the capsules a policy prunes); safe while
    captures run (they and gc take repository locks)."""
    from sojourn.workspace.gc import collect

    with _Workspaces(repo) as store:
        return collect(store, keep_last=keep_last, prune_orphans=prune_orphans, dry_run=dry_run, wait=wait,
                       on_progress=on_progress)
