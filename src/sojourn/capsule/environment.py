"""Which distributions (and versions) a capsule's library references come from."""

from __future__ import annotations

import functools
import importlib.metadata as md
import sys
import warnings
from typing import Any

from sojourn.errors import SojournWarning


@functools.lru_cache(maxsize=1)
def _top_levels() -> list[tuple[Any, frozenset[str]]]:
    """Every installed distribution with the top-level modules it provides."""
    # What packages_distributions() reads, minus its parsing of every distribution's
    # METADATA for its name (most of its cost, ~1 s on a large environment): only the
    # distributions of modules a capsule uses need a name.
    declared = getattr(md, "_top_level_declared", None)
    inferred = getattr(md, "_top_level_inferred", None)
    if declared is None or inferred is None:
        return []
    return [(d, frozenset(declared(d) or inferred(d))) for d in md.distributions()]


@functools.cache
def _providers(mod: str) -> tuple[str, ...]:
    """Names of the distributions that provide top-level module ``mod`` (as
    ``importlib.metadata.packages_distributions()[mod]``, in the same order)."""
    try:
        tops = _top_levels()
        if not tops:
            return tuple(md.packages_distributions().get(mod, []))
        return tuple(d.metadata["Name"] for d, names in tops if mod in names)
    except Exception:
        return ()


def distributions_for(modules: set[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for mod in sorted(modules):
        if mod in sys.stdlib_module_names or mod in ("builtins", "__main__", "sojourn"):
            continue
        for dist in _providers(mod):
            try:
                out[dist] = md.version(dist)
            except md.PackageNotFoundError:
                continue
    return out


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
