"""The service layer: every front end (Python API, CLI, notebook, console, agents) calls these
functions and gets dataclasses back. Nothing here prints. One module per area; this package
re-exports them so that callers write ``ops.capture``, ``ops.run``..."""

from __future__ import annotations

from sojourn.ops.capsules import (
    CapsuleInfo,
    CapsuleRef,
    PathLike,
    VariableInfo,
    VerifyReport,
    capture,
    inspect,
    restore,
    scan,
    verify,
)
from sojourn.ops.workspaces import (
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
    "PathLike",
    "VariableInfo",
    "VerifyReport",
    "WorkspaceDetail",
    "WorkspaceLog",
    "capture",
    "follow_logs",
    "inspect",
    "logs",
    "ps",
    "restore",
    "resume",
    "run",
    "scan",
    "show",
    "suspend",
    "verify",
]
