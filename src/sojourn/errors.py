"""One exception root for everything sojourn raises.

Callers catch :class:`SojournError`; the few subclasses exist where a caller can act
differently on them, and each also derives from the builtin that fits, so code that
already handles ``FileNotFoundError`` or ``ValueError`` keeps working.
"""

from __future__ import annotations

from dataclasses import dataclass


class SojournError(Exception):
    """Root of every error sojourn raises on purpose."""


class SojournWarning(UserWarning):
    """Something worked but deserves a person's attention (e.g. a version mismatch)."""


class RepositoryError(SojournError):
    """The repository cannot be opened, read or written."""


class RepositoryNotFound(RepositoryError, FileNotFoundError):
    """No repository (or no such object) at the given location."""


class ObjectNotFound(RepositoryError, KeyError):
    """A chunk, capsule or record is missing from the repository."""

    def __str__(self) -> str:  # KeyError quotes its argument; we want the plain message
        return str(self.args[0]) if self.args else ""


class AlreadyExists(RepositoryError, FileExistsError):
    """An exclusive create found the object already there (the compare-and-swap lost)."""


class StoreUnavailable(RepositoryError):
    """The store failed in a way that may pass (network, a 5xx, throttling, EIO): retried with
    backoff up to a deadline, then raised. Permanent failures (no space, permission) are
    plain :class:`RepositoryError` and are never retried."""


class RepositoryChanged(RepositoryError):
    """The repository at a location is not the one this process opened (deleted, unmounted,
    replaced): nothing is written into it."""


class IntegrityError(SojournError, ValueError):
    """Stored data does not match its hash, signature, format version or fingerprint."""


class CaptureError(SojournError, TypeError):
    """The namespace holds objects that cannot travel; ``problems`` lists every one."""

    def __init__(self, message: str, problems: list[Problem]):
        super().__init__(message)
        self.problems = problems


class RestoreError(SojournError):
    """A capsule could not be turned back into live objects."""


class MissingLibraryError(RestoreError, ModuleNotFoundError):
    """The capsule needs library modules this interpreter cannot import; nothing was
    unpickled. ``modules`` names them."""

    def __init__(self, message: str, modules: list[str]):
        super().__init__(message)
        self.modules = modules
        self.name = modules[0] if modules else None

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class Problem:
    """One object that cannot travel, with its path from a root variable and why."""

    path: str
    type: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path} ({self.type}): {self.reason}"
