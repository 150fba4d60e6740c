"""Workspaces: the durable identity of a session across every process and machine it runs on.

The repository is the single source of truth (no server). A workspace is an append-only event
log (``store.py``) folded into a record (``records.py``); authority over it is an epoch taken
by compare-and-swap (``authority.py``); each allocation is a supervised session process
(``supervisor.py`` outside the program, ``session.py`` inside it) whose output becomes one
continuous log (``logs.py``). The verbs (run, resume, suspend, ps, show, logs) are in
``sessions.py``; see ``docs/workspaces.md``.
"""

from __future__ import annotations

from sojourn.workspace.errors import AuthorityLost, WorkspaceError, WorkspaceNotFound

__all__ = ["AuthorityLost", "WorkspaceError", "WorkspaceNotFound"]
