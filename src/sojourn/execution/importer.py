"""The import hook: the program's own modules run in normal form too.

A module whose file lies under one of the workspace roots (the script's folder, the working
directory) and not in the standard library, site-packages or sojourn itself is compiled from
its source through :mod:`transform` instead of from its ``.pyc``. Library code is never
transformed: a pause that finds library code on the stack waits until it returns.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
from collections.abc import Sequence
from typing import Any

from sojourn.capsule.source import is_library_file
from sojourn.execution.runtime import RUNTIME


class TransformingLoader(importlib.machinery.SourceFileLoader):
    def get_code(self, fullname: str) -> types.CodeType:  # type: ignore[override]
        raise ImportError("the transforming loader executes modules itself")

    def exec_module(self, module: types.ModuleType) -> None:
        data = self.get_data(self.path)
        source = importlib.util.decode_source(data)
        tm = RUNTIME.load(source, module.__name__, self.path, module.__dict__)
        exec(tm.code, module.__dict__)


class WorkspaceFinder(importlib.abc.MetaPathFinder):
    def __init__(self, roots: Sequence[str]):
        self.roots = sorted({os.path.realpath(r) for r in roots})

    def owns(self, path: str) -> bool:
        real = os.path.realpath(path)
        inside = any(real == r or real.startswith(r + os.sep) for r in self.roots)
        return inside and not is_library_file(real)

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or not spec.origin or not spec.origin.endswith(".py") or not self.owns(spec.origin):
            return None
        spec.loader = TransformingLoader(fullname, spec.origin)
        return spec


def install(roots: Sequence[str]) -> WorkspaceFinder:
    for f in list(sys.meta_path):
        if isinstance(f, WorkspaceFinder):
            sys.meta_path.remove(f)
    finder = WorkspaceFinder(roots)
    sys.meta_path.insert(0, finder)
    return finder
