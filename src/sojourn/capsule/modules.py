"""Workspace modules on the destination: imported from the restored files, or rebuilt.

The capsule records the source and hash of every workspace module it references by name.
On restore the module is imported as usual (the restored workspace is on ``sys.path``); if
it cannot be found, or its file differs from what was captured, it is rebuilt from the
recorded source so that the capsule's objects get the definitions they were captured with.
"""

from __future__ import annotations

import hashlib
import importlib
import sys
import types
import warnings
from pathlib import Path
from typing import Any

from sojourn.capsule.context import current_or_none
from sojourn.errors import SojournWarning


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
    if mod is None:
        try:
            mod = importlib.import_module(name)
        except ImportError:
            if rec is None:
                raise
            return _rebuild(name, rec, reason="it cannot be imported here")
    if rec is None or _file_hash(mod) == rec["sha256"]:
        return mod
    return _rebuild(name, rec, reason=f"{getattr(mod, '__file__', name)} differs from the captured source")


def _rebuild(name: str, rec: dict[str, Any], reason: str) -> types.ModuleType:
    warnings.warn(
        f"module {name!r} was rebuilt from the source recorded in the capsule because {reason}",
        SojournWarning,
        stacklevel=3,
    )
    mod = types.ModuleType(name)
    filename = rec.get("path") or f"<sojourn:{name}>"
    ctx = current_or_none()
    if ctx is not None and rec.get("path"):
        filename = str(ctx.files_to / rec["path"])
    mod.__file__ = filename
    if rec.get("is_package"):
        mod.__path__ = [str(Path(filename).parent)]
        mod.__package__ = name
    else:
        mod.__package__ = name.rpartition(".")[0]
    sys.modules[name] = mod
    try:
        exec(compile(rec["source"], filename, "exec"), mod.__dict__)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return mod
