"""The service layer: every front end (Python API, CLI, notebook, console, agents) calls these
functions and gets dataclasses back. Nothing here prints. One module per area; this package
re-exports them so that callers write ``ops.capture``, ``ops.run``..."""

from __future__ import annotations

from sojourn.ops.capsules import (
    CapsuleInfo,
    CapsuleRef,
    CapturedSource,
    PathLike,
    VariableInfo,
    VerifyReport,
    capture,
    inspect,
    restore,
    scan,
    sources,
    verify,
    write_sources,
)
from sojourn.ops.history import checkpoint, fork, gc, history
from sojourn.ops.machines import MachineInfo, machines, remove_machine, set_machine, sign_machines
from sojourn.ops.repository import RepositoryInfo, init_repository
from sojourn.ops.workspaces import (
    DetachedSession,
    WorkspaceDetail,
    WorkspaceLog,
    follow_logs,
    logs,
    ps,
    resume,
    run,
    show,
    suspend,
)

__all__ = [
    "CapsuleInfo",
    "CapsuleRef",
    "CapturedSource",
    "DetachedSession",
    "MachineInfo",
    "PathLike",
    "RepositoryInfo",
    "VariableInfo",
    "VerifyReport",
    "WorkspaceDetail",
    "WorkspaceLog",
    "capture",
    "checkpoint",
    "follow_logs",
    "fork",
    "gc",
    "history",
    "init_repository",
    "inspect",
    "logs",
    "machines",
    "ps",
    "remove_machine",
    "restore",
    "resume",
    "run",
    "scan",
    "set_machine",
    "show",
    "sign_machines",
    "sources",
    "suspend",
    "verify",
    "write_sources",
]
