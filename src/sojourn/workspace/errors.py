"""Errors of the workspace layer (all :class:`~sojourn.errors.SojournError`)."""

from __future__ import annotations

from sojourn.errors import SojournError


class WorkspaceError(SojournError):
    """A workspace cannot do what was asked in its present state (the message says why)."""


class WorkspaceNotFound(WorkspaceError, LookupError):
    """No workspace with that id, id prefix or name."""


class AuthorityLost(WorkspaceError):
    """Another writer holds the workspace's epoch: the compare-and-swap was lost."""

    def __init__(self, message: str, epoch: int, holder: str | None):
        super().__init__(message)
        self.epoch = epoch
        self.holder = holder
