"""The runtime of a program under sojourn: its transformed modules and the names their code uses.

Every transformed module's globals get a few ``__sojourn_*`` names: the pause flag and the
function the checks call, the ``for``-iterator hook, and what resume copies use to re-enter
a saved frame. The capsule skips ``__sojourn*`` names, so none of this travels.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import itertools
import marshal
import os
import pickle
import sys
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sojourn.execution import transform as T
from sojourn.execution.checks import instrument
from sojourn.execution.contexts import WithReentry
from sojourn.execution.iterhooks import iter_function

PauseHook = Callable[["TransformedModule", int, types.FrameType], None]
OomHook = Callable[["TransformedModule", int, types.FrameType, bool], None]

# What a statement's out-of-memory guard catches: MemoryError, and RuntimeError because torch
# reports a failed allocation as one (torch.OutOfMemoryError, or "can't allocate memory" on
# the CPU). The hook tells them apart; anything else is re-raised untouched.
OOM_TYPES = (MemoryError, RuntimeError)


class _Sentinel:
    """A marker that pickles by reference (a resume copy compares it by identity)."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"<sojourn {self.name}>"

    def __reduce__(self) -> str:
        return self.name


BOOT = _Sentinel("BOOT")  # what a re-created generator yields once, while it is being rebuilt
SENT = _Sentinel("SENT")  # "no item": the first pass of a re-entered loop, an exhausted iterator


@dataclass(eq=False)
class TransformedModule:
    name: str
    filename: str
    source: str
    layout: T.Layout
    code: types.CodeType
    namespace: dict[str, Any]
    scope_code: dict[str, types.CodeType] = field(default_factory=dict)
    _clean: tuple[ast.Module, dict[str, ast.FunctionDef]] | None = None

    def clean(self) -> tuple[ast.Module, dict[str, ast.FunctionDef]]:
        """The normalized tree without checks, from which resume copies are cut."""
        if self._clean is None:
            tree, layout, defs = T.normalise(self.source, self.name, self.filename)
            if layout.digest != self.layout.digest:  # cannot happen: normalise is deterministic
                raise RuntimeError(f"the layout of {self.filename} changed between two transforms")
            self._clean = (tree, defs)
        return self._clean


# -- compiling, with a cache keyed by the source hash ------------------------------------------


def _cache_dir() -> Path | None:
    root = os.environ.get("SOJOURN_CACHE")
    if root == "":
        return None
    if root is None:
        from sojourn.repository.repo import sojourn_home

        return sojourn_home() / "cache" / "transform"
    return Path(root)


@functools.lru_cache(maxsize=1)
def _transformer_hash() -> str:
    # The cache must not outlive a change of the transform itself, even without a version bump:
    # the normaliser, the layout it records, the expression rules it follows and the checks and
    # guards it inserts.
    from sojourn.execution import checks, expressions, layout

    h = hashlib.sha256()
    for mod in (T, layout, expressions, checks):
        h.update(Path(mod.__file__ or "").read_bytes())
    return h.hexdigest()[:16]


def compile_source(source: str, name: str, filename: str) -> tuple[types.CodeType, T.Layout]:
    """The normal form of ``source``, compiled, and its layout. Bytecode is cached per Python
    version (it never travels); the layout is the same everywhere."""
    sha = T.source_hash(source)
    key = hashlib.sha256(
        f"{T.TRANSFORM_VERSION}|{_transformer_hash()}|{sys.implementation.cache_tag}|{name}|{filename}|{sha}".encode()
    ).hexdigest()
    cache = _cache_dir()
    path = cache / f"{key}.bin" if cache is not None else None
    if path is not None:
        try:
            data = path.read_bytes()
            n = int.from_bytes(data[:8], "little")
            code = marshal.loads(data[8 : 8 + n])
            layout = pickle.loads(data[8 + n :])
            if isinstance(code, types.CodeType) and isinstance(layout, T.Layout) and layout.sha256 == sha:
                return code, layout
        except (OSError, ValueError, EOFError, pickle.UnpicklingError, TypeError):
            pass
    tree, layout, _ = T.normalise(source, name, filename)
    instrument(tree)
    ast.fix_missing_locations(tree)
    code = compile(tree, filename, "exec", dont_inherit=True)
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            blob = marshal.dumps(code)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_bytes(len(blob).to_bytes(8, "little") + blob + pickle.dumps(layout, protocol=5))
            os.replace(tmp, path)
        except OSError:
            pass  # a cache that cannot be written only costs time
    return code, layout


def walk_code(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            yield from walk_code(c)


class Runtime:
    """All transformed modules of this process (one instance: :data:`RUNTIME`)."""

    def __init__(self) -> None:
        self.modules: dict[str, TransformedModule] = {}
        self.main: TransformedModule | None = None
        self.main_codes: set[types.CodeType] = set()
        self._scopes: dict[types.CodeType, tuple[TransformedModule, str]] = {}
        self.transparent_codes: set[types.CodeType] = {_reenter.__code__}
        self.flag: bool | None = None  # None: no pause pending (the checks test `is not None`)
        self.on_pause: PauseHook | None = None
        self.on_oom: OomHook | None = None
        self.variants: dict[tuple[Any, ...], types.CodeType] = {}
        self.previous_main: types.ModuleType | None = None  # the __main__ the script replaced
        # A resume from sources edited since the capture: per changed module, from the
        # captured layout to the edited one (sojourn.execution.edits). While the resume's
        # restore compares fingerprints, the program's code is named as the capsule names it.
        self.remaps: dict[str, Any] = {}
        self.as_captured = False

    # -- modules ---------------------------------------------------------------------------

    def load(self, source: str, name: str, filename: str, namespace: dict[str, Any]) -> TransformedModule:
        code, layout = compile_source(source, name, filename)
        tm = TransformedModule(name, filename, source, layout, code, namespace)
        self.modules[name] = tm
        self.register_code(tm, code)
        self.install(tm)
        if name == "__main__":
            self.main = tm
            self.main_codes.add(code)
        return tm

    def register_code(self, tm: TransformedModule, code: types.CodeType, variant_of: str | None = None) -> None:
        """Map every function code object in ``code`` to its scope (by qualname and first line,
        which the transform keeps)."""
        for c in walk_code(code):
            if c is code and variant_of is not None:
                self._scopes[c] = (tm, variant_of)
                continue
            key = f"{c.co_qualname}@{c.co_firstlineno}"
            scope = tm.layout.scopes.get(key)
            if scope is not None and scope.kind in ("function", "generator"):
                self._scopes[c] = (tm, key)
                tm.scope_code.setdefault(key, c)

    def scope_of(self, code: types.CodeType) -> tuple[TransformedModule, str] | None:
        if code in self.main_codes and self.main is not None:
            return self.main, "<module>"
        return self._scopes.get(code)

    def install(self, tm: TransformedModule) -> None:
        ns = tm.namespace
        ns[T.FLAG] = self.flag
        ns[T.PAUSE] = _make_pause(self, tm)
        ns[T.ITER] = iter_function()
        ns[T.REENTER] = _reenter
        ns[T.BOOT] = BOOT
        ns[T.SENT] = SENT
        ns[T.CHAIN] = itertools.chain
        ns[T.WITH] = WithReentry
        ns[T.OOM] = _make_oom(self, tm)
        ns[T.OOMTYPES] = OOM_TYPES

    def set_flag(self, value: bool) -> None:
        flag = True if value else None
        self.flag = flag
        for tm in list(self.modules.values()):
            tm.namespace[T.FLAG] = flag

    def refresh_iter(self) -> None:
        fn = iter_function()
        for tm in list(self.modules.values()):
            tm.namespace[T.ITER] = fn

    def module(self, name: str) -> TransformedModule:
        tm = self.modules.get(name)
        if tm is None:
            import importlib

            importlib.import_module(name)
            tm = self.modules.get(name)
            if tm is None:
                raise RuntimeError(f"module {name!r} was imported without sojourn's transform")
        return tm

    def current_record(self, rec: Any) -> Any:
        """A frame record of the capsule, in the statement ids of the sources as they are now."""
        if not self.remaps:
            return rec
        from sojourn.execution.edits import current_record

        return current_record(self.remaps, rec)

    def reset(self) -> None:
        self.__init__()  # type: ignore[misc]


def _make_pause(rt: Runtime, tm: TransformedModule) -> Callable[[int], None]:
    def pause(sid: int) -> None:
        hook = rt.on_pause
        if hook is not None:
            hook(tm, sid, sys._getframe(1))

    return pause


def _make_oom(rt: Runtime, tm: TransformedModule) -> Callable[..., None]:
    def oom(sid: int, header: bool = False) -> None:
        hook = rt.on_oom
        if hook is not None:
            hook(tm, sid, sys._getframe(1), header)

    return oom


def _reenter(rec: Any, stop: bool = False) -> Any:
    """Carry on a saved frame from its statement; what the original call would have returned.

    Resume copies call this where the paused call stood, so the call's own expression (its
    name lookups and arguments) is not evaluated again. With ``stop``, an exhausted iterator's
    ``StopIteration`` becomes :data:`SENT` (a ``for`` loop whose ``__next__`` was paused).
    """
    from sojourn.execution.resumeform import variant_args, variant_function

    fn = variant_function(RUNTIME, rec)
    args = variant_args(fn, rec)
    try:
        result = fn(*args)
    except StopIteration:
        if stop:
            return SENT
        raise
    if rec.call == "init":
        return rec.result
    return result


RUNTIME = Runtime()
