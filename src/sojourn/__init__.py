"""sojourn: make a running Python program portable.

    ref = sojourn.capture(globals())          # a verified, portable capsule
    ns = sojourn.restore(ref.id)              # anywhere, in a fresh interpreter
    sojourn.verify(ref.id)                    # restore in a fresh interpreter and compare
"""

from __future__ import annotations

from sojourn.errors import (
    CaptureError,
    IntegrityError,
    Problem,
    RepositoryError,
    RestoreError,
    SojournError,
    SojournWarning,
)
from sojourn.ops import (
    CapsuleInfo,
    CapsuleRef,
    VerifyReport,
    capture,
    init_repository,
    inspect,
    restore,
    scan,
    verify,
)

__version__ = "0.1.0"


def load_ipython_extension(shell: object) -> None:
    """``%load_ext sojourn``: the notebook front end loads only now (import sojourn stays cheap)."""
    from sojourn.notebook import load_ipython_extension as load

    load(shell)


def unload_ipython_extension(shell: object) -> None:
    from sojourn.notebook import unload_ipython_extension as unload

    unload(shell)

__all__ = [
    "CapsuleInfo",
    "CapsuleRef",
    "CaptureError",
    "IntegrityError",
    "Problem",
    "RepositoryError",
    "RestoreError",
    "SojournError",
    "SojournWarning",
    "VerifyReport",
    "capture",
    "init_repository",
    "inspect",
    "restore",
    "scan",
    "verify",
]
