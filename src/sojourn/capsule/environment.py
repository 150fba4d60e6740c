"""The environment a capsule records (sojourn.environment.record) and checks on restore."""

from __future__ import annotations

import importlib.metadata as md
import sys
import warnings
from typing import Any

from sojourn.environment.plan import missing_here, refusal
from sojourn.environment.record import distributions_for, record_needs, record_packages
from sojourn.errors import MissingLibraryError, SojournWarning

__all__ = ["check_distributions", "distributions_for", "record_needs", "record_packages", "refuse_missing"]


def refuse_missing(manifest: Any, python: str | None = None) -> None:
    """Refuse, before anything is unpickled (or a program's imports run again), a capsule
    whose library modules this interpreter cannot import, naming each distribution, its
    version and the variables that need it, and what to run."""
    missing = missing_here(manifest.needs)
    if missing:
        raise MissingLibraryError(refusal(manifest.id, missing, python), [m.module for m in missing])


def _major(v: str) -> str:
    return v.split(".", 1)[0]


def check_distributions(recorded: dict[str, str], environment: dict[str, Any]) -> list[str]:
    """Warn precisely about every distribution whose major version differs (or is absent)."""
    notes = []
    for dist, version in sorted(recorded.items()):
        try:
            here = md.version(dist)
        except md.PackageNotFoundError:
            notes.append(f"{dist} {version} was used at capture but is not installed here")
            continue
        if _major(here) != _major(version):
            notes.append(
                f"{dist} {version} was used at capture, {here} is installed here (major version "
                "differs): its objects may not load or may behave differently"
            )
    py = environment.get("python")
    if py and py.rsplit(".", 1)[0] != ".".join(map(str, sys.version_info[:2])):
        notes.append(
            f"captured on Python {py}, restoring on {sys.version.split()[0]}: user code is "
            "recompiled from source"
        )
    for n in notes:
        if "major version" in n or "not installed" in n:
            warnings.warn(n, SojournWarning, stacklevel=4)
    return notes
