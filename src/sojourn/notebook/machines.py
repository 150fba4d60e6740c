"""Where a kernel can run: a machine name turned into an interpreter and limits.

Issue 4's ``sojourn.providers.machines`` (the machines config, each machine with its python
and memory limit) is used when it is installed; until then, and for machines it does not
know, a machine is another local process: ``local`` (this interpreter), a path to a python,
or a ``pythonX.Y`` found on PATH or as ``.venvX.Y`` in the working directory or above.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Machine:
    name: str
    python: str
    memory: int | None = None  # bytes, RLIMIT_DATA of the kernel process
    env: tuple[tuple[str, str], ...] = ()


_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", text.lower())
    if not m:
        raise ValueError(f"cannot read {text!r} as a size; write e.g. 512MiB or 4G")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def _from_config(name: str, repo: Any) -> Machine | None:
    try:
        from sojourn.providers import machines as config  # issue 4's machines config
    except ImportError:
        return None
    if repo is None or not hasattr(config, "get_machine"):
        return None
    try:
        m: Any = config.get_machine(repo, name)
    except Exception:
        return None  # not a configured machine: try the local forms below
    python = getattr(m, "python", None) or sys.executable
    if os.sep not in python:
        python = shutil.which(python) or python
    memory = getattr(m, "memory", None)
    return Machine(name, str(python), int(memory) if memory else None)


def _find_python(version: str) -> str | None:
    for d in [Path.cwd(), *Path.cwd().parents]:
        cand = d / f".venv{version}" / "bin" / "python"
        if cand.exists():
            return str(cand)
    return shutil.which(f"python{version}")


def resolve(name: str, memory: str | None = None, repo: Any = None) -> Machine:
    limit = parse_size(memory) if memory else None
    m = _from_config(name, repo)
    if m is not None:
        return Machine(m.name, m.python, limit or m.memory, m.env)
    if name in ("local", "here", "localhost"):
        return Machine(name, sys.executable, limit)
    if os.sep in name and os.access(name, os.X_OK):
        return Machine(name, os.path.abspath(name), limit)
    v = re.fullmatch(r"(?:python)?(3\.\d+)", name)
    if v:
        python = _find_python(v.group(1))
        if python:
            return Machine(name, python, limit)
    raise ValueError(f"unknown machine {name!r}: use 'local', a path to a python interpreter, "
                     "'python3.12' (found on PATH or as .venv3.12), or a machine of the machines "
                     "config (`sojourn machines`)")
