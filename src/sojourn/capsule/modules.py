"""Workspace modules on the destination: imported from the restored files, or rebuilt.

The capsule records the source and hash of every workspace module it references by name.
On restore the module is imported as usual (the restored workspace is on ``sys.path``); if
it cannot be found, or its file differs from what was captured, it is rebuilt from the
recorded source (with a :class:`SojournWarning`) so that the capsule's objects get the
definitions they were captured with. A rebuilt module keeps its recorded source, so its
functions can be captured again and their tracebacks show their lines.
"""

from __future__ import annotations

import hashlib
import importlib
import linecache
import os
import sys
import types
import warnings
from pathlib import Path
from typing import Any

from sojourn.capsule.context import current_or_none
from sojourn.errors import SojournWarning

# Modules rebuilt from a capsule in this process: name -> the record they were built from.
_REBUILT: dict[str, dict[str, Any]] = {}
# Modules whose file may differ from the source a capsule recorded: whoever restores checked
# the change (a paused program's resume accepts edits that leave its frames alone).
_ACCEPTED: set[str] = set()


def accept_edited(names: set[str]) -> None:
    """Restores in this process import these modules from their files even where a file
    differs from the source the capsule recorded, instead of rebuilding the recorded one."""
    _ACCEPTED.update(names)


def rebuilt_module_source(name: str) -> dict[str, Any] | None:
    rec = _REBUILT.get(name)
    mod = sys.modules.get(name)
    if rec is None or mod is None or getattr(mod, "__sojourn_rebuilt__", None) is not rec:
        return None
    return rec


def source_record(name: str, workspace: Path | None) -> dict[str, Any] | None:
    """What a capsule records about a workspace module: its source, hash and path."""
    rebuilt = rebuilt_module_source(name)
    if rebuilt is not None:
        return dict(rebuilt)
    mod = sys.modules.get(name)
    path = getattr(mod, "__file__", None)
    if not path:
        return None
    try:
        raw = Path(path).read_bytes()
    except OSError:
        return None
    rel = None
    if workspace is not None:
        try:
            rel = os.path.relpath(os.path.realpath(path), os.path.realpath(workspace))
        except ValueError:
            rel = None
        if rel is not None and rel.startswith(".."):
            rel = None
    return {
        "sha256": hashlib.sha256(raw).hexdigest(),
        "path": rel,
        "source": raw.decode("utf-8", errors="surrogateescape"),
        "is_package": bool(getattr(mod, "__path__", None)),
    }


def _file_hash(mod: types.ModuleType) -> str | None:
    path = getattr(mod, "__file__", None)
    if not path:
        return None
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def ensure_user_module(name: str) -> types.ModuleType:
    ctx = current_or_none()
    records: dict[str, Any] = getattr(ctx, "user_modules", {}) if ctx is not None else {}
    rec = records.get(name)
    mod = sys.modules.get(name)
    if mod is not None and rebuilt_module_source(name) is not None:
        return mod
    if mod is None:
        parent = name.rpartition(".")[0]
        if parent and parent in records:
            ensure_user_module(parent)
        try:
            mod = importlib.import_module(name)
        except ImportError as e:
            if rec is None:
                raise ImportError(
                    f"workspace module {name!r} cannot be imported here ({e}) and the capsule does "
                    "not hold its source; restore the workspace files (files_to=) or put it on sys.path"
                ) from e
            return _rebuild(name, rec, reason="it cannot be imported here")
    if rec is None or name in _ACCEPTED or _file_hash(mod) == rec["sha256"]:
        return mod
    return _rebuild(name, rec, reason=f"{getattr(mod, '__file__', name)} differs from the captured source")


def _rebuild(name: str, rec: dict[str, Any], reason: str) -> types.ModuleType:
    message = f"module {name!r} was rebuilt from the source recorded in the capsule because {reason}"
    warnings.warn(message, SojournWarning, stacklevel=3)
    ctx = current_or_none()
    if ctx is not None:
        ctx.warnings.append(message)  # also in the restore's notes
    mod = types.ModuleType(name)
    filename = f"<sojourn:{name}>"
    package_dir = None
    if rec.get("path"):
        root = ctx.files_to if ctx is not None else Path.cwd()
        path = root / rec["path"]
        package_dir = str(path.parent)
        if not path.exists():
            filename = str(path)  # a file that differs keeps its name for its own text
    mod.__file__ = filename
    if rec.get("is_package"):
        mod.__path__ = [package_dir] if package_dir else []
        mod.__package__ = name
    else:
        mod.__package__ = name.rpartition(".")[0]
    mod.__sojourn_rebuilt__ = rec  # type: ignore[attr-defined]
    source = rec["source"]
    # Where the file is gone, linecache serves the recorded text: code rebuilt from it can be
    # found again (lambdas, closures) and tracebacks show its lines. mtime None: never stale.
    if not os.path.exists(filename):  # never a file that exists: that one differs
        lines = source.splitlines(keepends=True)
        linecache.cache[filename] = (len(source), None, lines, filename)
    previous = sys.modules.get(name)
    sys.modules[name] = mod
    _REBUILT[name] = rec
    try:
        exec(compile(source, filename, "exec", dont_inherit=True), mod.__dict__)
    except BaseException:
        _REBUILT.pop(name, None)
        if previous is not None:
            sys.modules[name] = previous
        else:
            sys.modules.pop(name, None)
        raise
    return mod
