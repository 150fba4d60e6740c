"""What a capsule needs that a destination lacks, what to install there, and how to say so.

Two policies: ``exact`` (the default) installs every recorded distribution at its recorded
version; ``compatible`` accepts what is there when its major version is the recorded one and
otherwise installs the newest release of that major version at least as new as the
recorded one. Restore refuses a capsule whose library modules cannot be imported *before*
unpickling anything, naming each distribution, its version and the variables that need it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
from dataclasses import dataclass
from typing import Any

from sojourn.environment.record import canonical

MODES = ("exact", "compatible")


@dataclass(frozen=True)
class Missing:
    module: str
    distribution: str | None
    version: str | None
    variables: tuple[str, ...]

    def describe(self) -> str:
        what = f"{self.distribution} {self.version}" if self.distribution else f"module {self.module!r}"
        if self.distribution and canonical(self.distribution) != canonical(self.module):
            what += f" (module {self.module})"
        shown = ", ".join(repr(v) for v in self.variables[:4]) + (", …" if len(self.variables) > 4 else "")
        return what + (f" for {shown}" if shown else "")

    def requirement(self) -> str:
        if not self.distribution:
            return self.module
        return f"{self.distribution}=={base_version(self.version)}" if self.version else self.distribution


def base_version(version: str | None) -> str:
    """``2.13.0+cpu`` → ``2.13.0``: the local part names a build the index may not have (the
    builder picks the build for the destination's hardware)."""
    return (version or "").partition("+")[0]


def importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def missing_here(needs: dict[str, dict[str, Any]]) -> list[Missing]:
    """The needed library modules this interpreter cannot import (nothing is imported)."""
    return [
        Missing(mod, n.get("distribution"), n.get("version"), tuple(n.get("variables") or ()))
        for mod, n in sorted(needs.items()) if not importable(mod)
    ]


def missing_in(needs: dict[str, dict[str, Any]], modules: dict[str, bool]) -> list[Missing]:
    """The same, from a probe's answer about another interpreter."""
    return [
        Missing(mod, n.get("distribution"), n.get("version"), tuple(n.get("variables") or ()))
        for mod, n in sorted(needs.items()) if not modules.get(mod)
    ]


def refusal(capsule: str, missing: list[Missing], python: str | None = None) -> str:
    """One line: what is missing, for which variables, and the commands that fix it."""
    py = python or sys.executable
    reqs = " ".join(f"'{m.requirement()}'" for m in missing)
    return (
        f"capsule {capsule} needs " + "; ".join(m.describe() for m in missing)
        + f", not installed for {py}; nothing was unpickled. Install with "
        f"`uv pip install --python {py} {reqs}` (or pip), or let sojourn build the environment: add "
        "--build-env to `sojourn resume`, `sojourn move` or `sojourn verify`"
    )


def differences(packages: dict[str, dict[str, Any]], installed: dict[str, str], mode: str = "exact") -> list[str]:
    """Recorded distributions the interpreter lacks or has at another version (``exact``) or
    another major version (``compatible``)."""
    out = []
    for name, p in sorted(packages.items()):
        have = installed.get(canonical(name))
        want = p.get("version", "")
        if have is None:
            out.append(f"{name} {want} is missing")
        elif mode == "exact" and base_version(have) != base_version(want):
            out.append(f"{name} {have} is installed, {want} was recorded")
        elif mode == "compatible" and have.split(".")[0] != want.split(".")[0]:
            out.append(f"{name} {have} is installed, {want} was recorded (another major version)")
    return out


def requirement(name: str, p: dict[str, Any], mode: str = "exact") -> str:
    """The requirement line that installs ``name`` as recorded."""
    src = p.get("source") or {}
    version = base_version(p.get("version"))
    kind = src.get("kind", "index")
    if kind == "vcs" and src.get("commit"):
        return f"{name} @ {src.get('vcs', 'git')}+{src['url']}@{src['commit']}"
    # A wheel, archive or checkout on this host (an editable one is installed as a copy: the
    # environment must not change under a paused program). Where the path is gone (another
    # machine), the index is asked for the same version.
    url = str(src.get("url", ""))
    if kind in ("wheel", "archive", "local", "editable") and url.startswith("file://") and os.path.exists(url[7:]):
        return f"{name} @ {url}"
    if mode == "compatible":
        major = version.split(".")[0]
        return f"{name}>={version},<{int(major) + 1}" if major.isdigit() else f"{name}>={version}"
    return f"{name}=={version}"


def key(python: dict[str, Any], packages: dict[str, dict[str, Any]], mode: str, sojourn: str) -> str:
    """The environment's identity: the interpreter (version, implementation, platform,
    architecture), every requirement line and policy, and the sojourn it runs."""
    doc = {
        "python": {k: python.get(k) for k in ("version", "implementation", "platform", "machine")},
        "requirements": sorted(requirement(n, p, mode) for n, p in packages.items()),
        "mode": mode,
        "sojourn": sojourn,
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]
