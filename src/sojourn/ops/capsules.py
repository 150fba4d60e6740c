"""The service layer: every front end (Python API, CLI, notebook, console, agents) calls these
functions and gets dataclasses back. Nothing here prints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from sojourn.errors import Problem, SojournError
from sojourn.repository.repo import open_repository

if TYPE_CHECKING:
    from sojourn.capsule import format as fmt
    from sojourn.capsule.restore import Restored

# The capsule machinery (and the reducer table) loads on first use, not on `import sojourn`:
# `sojourn run` starts two interpreters and each pays for what it imports.

PathLike = str | os.PathLike[str]


@dataclass(frozen=True)
class VariableInfo:
    name: str
    type: str
    size: int
    fingerprint: str


@dataclass(frozen=True)
class CapsuleRef:
    """What ``capture`` returns: the capsule's id and what went into it."""

    id: str
    size: int
    variables: tuple[VariableInfo, ...]
    repo: str
    parent: str | None = None
    bytes_written: int = 0
    seconds: float = 0.0

    def __str__(self) -> str:
        return self.id


@dataclass
class CapsuleInfo:
    id: str
    created: str
    parent: str | None
    size: int
    environment: dict[str, Any]
    distributions: dict[str, str]
    variables: list[VariableInfo]
    files: list[dict[str, Any]]
    user_modules: dict[str, str]
    stats: dict[str, Any]
    labels: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class VerifyReport:
    capsule: str
    ok: bool
    python: str
    variables: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    error: str | None = None
    notes: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return self.ok

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _variables(manifest: fmt.Manifest) -> tuple[VariableInfo, ...]:
    return tuple(
        VariableInfo(v.name, v.type, v.size, v.fingerprint)
        for v in manifest.variables
        if v.name != "<process>"
    )


def capture(
    namespace: dict[str, Any],
    repo: PathLike | None = None,
    *,
    files: str | None = None,
    parent: str | None = None,
    labels: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
    include_secrets: bool | list[str] | None = None,
) -> CapsuleRef:
    """Capture ``namespace`` (and ``extra``, process-level state such as a paused program's
    stack, carried in the process segment with the same memo) into a capsule.

    With ``files``, credential files (``.env*``, ``.aws/``, ``*.pem``...) are left out and
    named in a warning; ``include_secrets`` takes them on purpose (True, or their paths)."""
    with open_repository(repo, create=True) as r:
        from sojourn.capsule.capture import capture_namespace

        m = capture_namespace(namespace, r, files=files, parent=parent, labels=labels, extra=extra,
                              include_secrets=include_secrets)
        return CapsuleRef(
            id=m.id,
            size=m.size,
            variables=_variables(m),
            repo=r.url,
            parent=m.parent,
            bytes_written=int(m.stats.get("bytes_written", 0)),
            seconds=float(m.stats.get("seconds_total", 0.0)),
        )


def restore(
    capsule_id: str,
    repo: PathLike | None = None,
    *,
    files_to: PathLike = ".",
    device_policy: str = "auto",
    into: dict[str, Any] | None = None,
) -> Restored:
    if device_policy not in ("auto", "cpu", "keep"):
        raise SojournError(f"device_policy must be 'auto', 'cpu' or 'keep', not {device_policy!r}")
    with open_repository(repo) as r:
        from sojourn.capsule.restore import restore_capsule

        return restore_capsule(r, capsule_id, files_to=files_to, device_policy=device_policy, into=into)


def scan(namespace: dict[str, Any], *, rehearse: bool = True) -> list[Problem]:
    """What in ``namespace`` cannot travel, and (``rehearse``) what a capsule's write check
    would refuse (rehearsed in a forked child); writes nothing."""
    from sojourn.capsule.scan import scan as _scan

    return _scan(namespace, rehearse=rehearse)


def inspect(capsule_id: str, repo: PathLike | None = None) -> CapsuleInfo:
    with open_repository(repo) as r:
        from sojourn.capsule import format as fmt

        m = fmt.load_manifest(r, capsule_id)
        files: list[dict[str, Any]] = []
        if m.files:
            from sojourn.capsule.workspace_files import list_entries

            files = list_entries(m.files, r.chunks)
        return CapsuleInfo(
            id=m.id,
            created=m.created,
            parent=m.parent,
            size=m.size,
            environment=m.environment,
            distributions=m.distributions,
            variables=list(_variables(m)),
            files=files,
            user_modules={k: v.get("sha256", "") for k, v in m.user_modules.items()},
            stats=m.stats,
            labels=m.labels,
        )


def verify(
    capsule_id: str,
    repo: PathLike | None = None,
    *,
    python: str | None = None,
    timeout: float = 600.0,
    build_env: bool = False,
) -> VerifyReport:
    """Restore the capsule in a fresh interpreter and compare every fingerprint there.

    A paused program's capsule is checked as its session's write check does (``python -m
    sojourn.execution check``: its sources found, the statement layout the same, the
    program's modules compiled again, then the capsule restored and every fingerprint
    compared, nothing run), in a scratch folder holding the capsule's workspace files."""
    import tempfile

    from sojourn.execution.checkpoint import LABEL

    with open_repository(repo) as r:
        from sojourn.capsule import format as fmt

        cap = fmt.resolve_id(r, capsule_id)
        manifest = fmt.load_manifest(r, cap)
        url = r.url
        program = isinstance(manifest.labels.get(LABEL), dict)
        if python is not None or build_env:
            # An interpreter too old, without sojourn's own modules or without the capsule's
            # libraries is named here in one line (or given an environment: ``build_env``).
            from sojourn.ops.environment import prepare_python

            python = prepare_python(r, cap, python, build_env=build_env)
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="sojourn-verify-") as tmp:
            if program:
                from sojourn.workspace.files import materialize

                materialize(r, cap, tmp)  # where a resume on another machine finds them
                cmd = [python or sys.executable, "-m", "sojourn.execution", "--repo", url, "check", cap]
            else:
                cmd = [python or sys.executable, "-m", "sojourn.capsule._verify_child", cap, url, tmp]
            env = dict(os.environ)
            src = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
            env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=tmp, env=env,
                                      stdin=subprocess.DEVNULL)
            except subprocess.TimeoutExpired:
                return VerifyReport(cap, False, "", error=f"the verifying interpreter did not finish in {timeout:.0f} s")
    seconds = time.perf_counter() - t0
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        err = proc.stderr.strip().splitlines()
        return VerifyReport(cap, False, "", seconds=seconds, error=err[-1] if err else f"exit code {proc.returncode}")
    data = json.loads(lines[-1])
    variables = data.get("variables")
    if program:  # the check compared them all, or failed
        variables = [{"name": v.name, "type": v.type, "fingerprint": v.fingerprint, "match": True}
                     for v in manifest.variables] if data.get("ok") else []
    return VerifyReport(
        capsule=cap,
        ok=bool(data["ok"]),
        python=data.get("python", ""),
        variables=variables or [],
        seconds=seconds,
        error=data.get("error"),
        notes=data.get("notes", []),
    )


@dataclass
class CapturedSource:
    """A source file of the program as a capsule holds it, and how the file stands now."""

    module: str
    path: str  # where it was at the capture
    relpath: str  # relative to the script's folder (its place under ``sojourn source --to DIR``)
    text: str
    sha256: str
    now: str  # "unchanged", "edited" or "gone": the file at ``path`` today

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _relpath(path: str, base: str) -> str:
    rel = os.path.relpath(path, base) if base else os.path.basename(path)
    if rel.startswith(".."):  # outside the script's folder: its absolute path, under the target
        rel = os.path.abspath(path).lstrip(os.sep)
    return rel


def sources(capsule_id: str, repo: PathLike | None = None) -> list[CapturedSource]:
    """The program's source files as the capsule captured them: a paused program's main
    script and workspace modules, or the workspace modules a namespace capsule refers to."""
    with open_repository(repo) as r:
        from sojourn.capsule import format as fmt

        m = fmt.load_manifest(r, capsule_id)
    from sojourn.execution.checkpoint import LABEL

    info = m.labels.get(LABEL)
    out: list[CapturedSource] = []
    base = os.path.dirname(info["script"]) if isinstance(info, dict) else ""
    if isinstance(info, dict):
        for name, src in info.get("sources", {}).items():
            if isinstance(src.get("text"), str):
                out.append(_captured(name, src["path"], _relpath(src["path"], base), src["text"]))
    seen = {s.module for s in out}
    for name, rec in sorted(m.user_modules.items()):
        if name not in seen and isinstance(rec.get("source"), str):
            rel = rec.get("path") or name.replace(".", os.sep) + (os.sep + "__init__.py" if rec.get("is_package") else ".py")
            out.append(_captured(name, os.path.join(base, rel) if base else rel, rel, rec["source"]))
    if not out:
        raise SojournError(f"capsule {m.id} holds no source of the program (it was written by an older sojourn, "
                           "or holds no code of the workspace)")
    return out


def _captured(module: str, path: str, rel: str, text: str) -> CapturedSource:
    import tokenize

    from sojourn.execution.transform import source_hash

    sha = source_hash(text)
    try:
        with tokenize.open(path) as f:  # decoded as Python (and the resume) reads it
            now = "unchanged" if source_hash(f.read()) == sha else "edited"
    except (OSError, SyntaxError, UnicodeDecodeError):
        now = "gone"
    return CapturedSource(module, path, rel, text, sha, now)


def write_sources(found: list[CapturedSource], to: PathLike) -> list[str]:
    """Write captured sources (from :func:`sources`) under ``to`` at their places relative
    to the script's folder; returns the paths written. Nothing outside ``to`` is written."""
    from pathlib import Path

    root = Path(to).absolute()
    written = []
    for s in found:
        dest = (root / s.relpath).absolute()
        if root not in dest.parents:
            raise SojournError(f"{s.relpath} would be written outside {root}")
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.sojourn-tmp")
        tmp.write_bytes(s.text.encode("utf-8", errors="surrogateescape"))
        os.replace(tmp, dest)
        written.append(str(dest))
    return written
