"""The environment a capsule needs, on the interpreter that will restore it
(docs/environment.md): use it as it is, build one with uv, or refuse naming what is missing."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from sojourn.errors import SojournError


@dataclass
class EnvironmentPlan:
    """What ``sojourn env CAP --python P`` shows: the capsule's needs against the target."""

    capsule: str
    python: str
    version: str
    supported: bool
    needs: dict[str, dict[str, Any]]
    packages: dict[str, dict[str, Any]]
    missing: list[str] = field(default_factory=list)  # library modules the target cannot import
    sojourn_missing: list[str] = field(default_factory=list)
    differences: list[str] = field(default_factory=list)
    requirements: list[str] = field(default_factory=list)  # what a build installs
    key: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def resolve_python(python: str | None) -> str:
    if python is None:
        return sys.executable
    found = shutil.which(python) if os.sep not in python else (python if os.access(python, os.X_OK) else None)
    if not found:
        raise SojournError(f"no Python interpreter {python!r}: give a path or a command on PATH")
    return os.path.abspath(found)


def _manifest(repo: Any, capsule: str) -> Any:
    from sojourn.capsule import format as fmt

    return fmt.load_manifest(repo, capsule)


def prepare_python(repo: Any, capsule: str | None, python: str | None, *, build_env: bool = False,
                   mode: str = "exact", progress: Callable[[str], None] | None = None) -> str:
    """The interpreter that restores ``capsule`` (an open repository's): ``python`` itself
    when it has every library module the capsule needs and sojourn's own, a built
    environment on it when ``build_env``, else a one-line refusal (before anything runs).
    Without a capsule (a live move of a program that has none yet) only sojourn's own
    modules are needed."""
    from sojourn.environment.build import prepare, stderr_progress
    from sojourn.workspace.capsules import child_env

    if capsule is None:
        cap, packages, needs = "(none yet)", {}, {}
    else:
        m = _manifest(repo, capsule)
        cap, packages, needs = m.id, m.packages, m.needs
    return prepare(cap, packages, needs, resolve_python(python), build_env=build_env, mode=mode,
                   env=child_env(), progress=progress or stderr_progress)


def plan(capsule: str, repo: Any = None, *, python: str | None = None, mode: str = "exact") -> EnvironmentPlan:
    """The capsule's recorded environment against ``python``: nothing is built."""
    from dataclasses import asdict as as_dict

    from sojourn.environment import plan as P
    from sojourn.environment.build import sojourn_origin
    from sojourn.environment.probe import probe
    from sojourn.repository.repo import open_repository
    from sojourn.workspace.capsules import child_env

    with open_repository(repo) as r:
        m = _manifest(r, capsule)
    py = resolve_python(python)
    target = probe(py, list(m.needs), env=child_env())
    return EnvironmentPlan(
        capsule=m.id, python=py, version=target.version, supported=target.supported, needs=m.needs,
        packages=m.packages, missing=[x.module for x in P.missing_in(m.needs, target.modules)],
        sojourn_missing=target.sojourn_missing(), differences=P.differences(m.packages, target.distributions, mode),
        requirements=sorted(P.requirement(n, p, mode) for n, p in m.packages.items()),
        key=P.key(as_dict(target), m.packages, mode, ":".join(sojourn_origin())),
    )


def build(capsule: str, repo: Any = None, *, python: str | None = None, mode: str = "exact",
          progress: Callable[[str], None] | None = None) -> str:
    """Build (or find cached) the capsule's environment on ``python``; its interpreter."""
    from sojourn.environment.build import build as build_env
    from sojourn.environment.build import stderr_progress
    from sojourn.repository.repo import open_repository

    with open_repository(repo) as r:
        m = _manifest(r, capsule)
    return build_env(m.packages, resolve_python(python), mode=mode, progress=progress or stderr_progress).python
