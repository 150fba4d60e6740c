"""Running a script under sojourn, and carrying a paused one on in a new process.

``run_script`` runs the script as ``__main__`` in this process, in normal form, with the pause
machinery installed. ``resume`` does, in a fresh process:

1. read the capsule's manifest (nothing unpickled yet) and refuse if a source was edited
   where the paused program stands (other edits are accepted, :mod:`edits`), or if this
   Python parses a source into a different layout;
2. compile the sources again (in normal form) and run again the main script's top-level
   imports that came before the paused statement (no definition: functions and classes come
   back from the capsule with their state);
3. restore the capsule into the main script's globals (fingerprints checked), then the other
   modules' globals, and run the rebuilt generators up to where they stopped;
4. run the main script's resume copy, which re-enters every saved frame in turn.
"""

from __future__ import annotations

import builtins
import os
import sys
import tokenize
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sojourn.errors import SojournError
from sojourn.execution import edits, importer, pause
from sojourn.execution.checkpoint import FORMAT_VERSION, LABEL
from sojourn.execution.runtime import RUNTIME
from sojourn.execution.transform import TRANSFORM_VERSION

PathLike = str | os.PathLike[str]


class ResumeError(SojournError):
    """A capsule cannot be carried on here (changed sources, not a paused program...)."""


@dataclass
class Resumed:
    """What ``resume(..., run=False)`` prepared: enough to check a capsule without running it."""

    capsule: str
    python: str
    where: str
    notes: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    edits: list[dict[str, Any]] = field(default_factory=list)  # sources changed since the capture, accepted


def _read_source(path: Path) -> str:
    with tokenize.open(path) as f:  # honours a coding cookie, as python itself does
        return f.read()


def _new_main(script: Path) -> types.ModuleType:
    mod = types.ModuleType("__main__")
    mod.__file__ = str(script)
    mod.__builtins__ = builtins  # type: ignore[attr-defined]
    mod.__loader__ = None
    mod.__spec__ = None
    RUNTIME.previous_main = sys.modules.get("__main__")
    sys.modules["__main__"] = mod
    return mod


def _prepare(script: Path, argv: Sequence[str]) -> types.ModuleType:
    sys.argv = [str(argv[0]) if argv else str(script), *argv[1:]]
    if sys.path:
        sys.path[0] = str(script.parent)
    else:
        sys.path.append(str(script.parent))
    importer.install([str(script.parent), os.getcwd()])
    from sojourn.execution import libiters, loaders

    loaders.install()
    libiters.install()
    return _new_main(script)


def _repository_id(repo: Any) -> str | None:
    """The id of the repository the program will pause into, if there is one now (None: the
    first pause creates it; one that cannot be opened now is opened, and its faults said, at
    the pause, as before, and a pinned URL keeps its id there: repository.repo.pin)."""
    from sojourn.errors import RepositoryError
    from sojourn.repository.repo import open_repository

    try:
        with open_repository(repo) as r:
            return r.id
    except RepositoryError:
        return None


def _config(repo: Any, on_capsule: Callable[[pause.PauseEvent], None] | None,
            on_refusal: Callable[[pause.PauseRefusal], None] | None, parent: str | None,
            files: str | None, labels: dict[str, Any] | None, signals: dict[int, tuple[str, float | None, str]] | None,
            scan_interval: float | None, on_oom: Callable[[BaseException], None] | None,
            verify: Callable[[str, float | None], str | None] | None = None) -> pause.PauseConfig:
    cfg = pause.PauseConfig(repo=repo, repo_id=_repository_id(repo), files=files, parent=parent,
                            labels=dict(labels or {}), on_capsule=on_capsule, on_refusal=on_refusal,
                            scan_interval=scan_interval, on_oom=on_oom, verify=verify)
    if signals is not None:
        cfg.signals = dict(signals)
    return cfg


def _run(ctl: pause.PauseController, code: types.CodeType, ns: dict[str, Any]) -> None:
    from sojourn.execution import oom

    try:
        exec(code, ns)
    except SystemExit as e:
        if e.code in (0, None):
            ctl.ended()
        raise
    except BaseException as e:
        oom.report_uncaptured(ctl, e)
        raise
    ctl.ended()


def run_script(
    path: PathLike,
    argv: Sequence[str] = (),
    *,
    repo: Any = None,
    on_capsule: Callable[[pause.PauseEvent], None] | None = None,
    on_refusal: Callable[[pause.PauseRefusal], None] | None = None,
    parent: str | None = None,
    files: str | None = None,
    labels: dict[str, Any] | None = None,
    signals: dict[int, tuple[str, float | None, str]] | None = None,
    scan_interval: float | None = 600.0,
    on_oom: Callable[[BaseException], None] | None = None,
    verify: Callable[[str, float | None], str | None] | None = None,
) -> int:
    """Run the script at ``path`` with ``argv`` as ``__main__`` in this process.

    Returns 0 when the script ends; its exceptions (``SystemExit`` included) propagate. When a
    pause lands, the capsule is written to ``repo``, ``on_capsule`` is called, and the process
    exits with :data:`~sojourn.execution.pause.EXIT_PAUSED`: this function does not return.
    When an out-of-memory error escapes a statement inside a loop of the program,
    ``on_oom(error)`` is called (make room for the capture), a capsule positioned before that
    statement goes to ``on_capsule`` (reason ``"oom"``), and the process exits with
    :data:`~sojourn.execution.oom.EXIT_OOM`. With ``verify`` (``PauseConfig.verify``), a
    capsule that would end the process is checked first, while the program waits; one that
    fails is refused and the program carries on.
    """
    script = Path(path).resolve()
    source = _read_source(script)
    main = _prepare(script, [str(path), *argv])
    tm = RUNTIME.load(source, "__main__", str(script), main.__dict__)
    ctl = pause.start(_config(repo, on_capsule, on_refusal, parent, files, labels, signals, scan_interval, on_oom,
                              verify))
    ctl.enabled = True
    _run(ctl, tm.code, main.__dict__)
    return 0


def _find_script(info: dict[str, Any]) -> Path:
    rel = info.get("script_rel")
    if rel and Path(rel).exists():
        return Path(rel).resolve()
    return Path(info["script"])


def _sources_now(info: dict[str, Any], script: Path) -> dict[str, tuple[str, str | None]]:
    """Per source of the program: where it is now, and its text (None when it is gone)."""
    out: dict[str, tuple[str, str | None]] = {}
    for name, src in info["sources"].items():
        path = script if name == "__main__" else Path(src["path"])
        if name != "__main__" and not path.exists():
            rel = os.path.relpath(src["path"], os.path.dirname(info["script"]))
            path = script.parent / rel
        try:
            out[name] = (str(path), _read_source(path))
        except (OSError, SyntaxError, UnicodeDecodeError):
            out[name] = (str(path), None)
    return out


def _check_sources(capsule: str, info: dict[str, Any], script: Path) -> list[edits.Change]:
    """The sources' changes since the capture that the resume accepts; a ResumeError for an
    edit inside the paused program (see :mod:`sojourn.execution.edits`)."""
    plan = edits.plan(info, _sources_now(info, script))
    if not plan.refused:
        return plan.changes
    why = "; ".join(plan.refused)
    if plan.touched:
        raise ResumeError(f"{why}: the code of a paused function up to the statement it is paused at must stay "
                          "as it was (comments, other functions and code after that statement may change). Undo "
                          f"that edit to resume; `sojourn source {capsule}` prints the source as captured")
    raise ResumeError(f"{why}. Put the captured sources back to resume: `sojourn source {capsule} --to DIR` "
                      "writes them")


def _say_changes(capsule: str, changes: list[edits.Change]) -> None:
    for c in changes:
        print(f"sojourn: {c.path} changed since capsule {capsule} was written (+{c.added} -{c.removed} lines); "
              "the paused program does not stand in what changed, so the new code runs:", file=sys.stderr)
        sys.stderr.write(c.diff)
    sys.stderr.flush()


def _program_path(info: dict[str, Any], script: Path) -> None:
    """Put back the folders of the workspace that the program had put on ``sys.path``
    (``sys.path.insert(0, "lib")``: the statement does not run again), where the script is
    now, in their order, after the script's own folder. Folders outside the script's are not
    the program's to carry (another machine's, another Python's site-packages)."""
    old = os.path.dirname(info["script"])
    found = []
    for entry in info.get("sys_path", []):
        if not isinstance(entry, str) or not entry:
            continue
        rel = os.path.relpath(os.path.abspath(entry), old) if os.path.isabs(entry) else None
        if rel is None or rel.startswith(".."):
            continue
        here = os.path.normpath(os.path.join(script.parent, rel))
        if here not in sys.path and here not in found and os.path.exists(here):
            found.append(here)
    sys.path[1:1] = found


def _import_again(codes: list[types.CodeType], ns: dict[str, Any]) -> None:
    """Run the main script's imports again (their side effects, submodules a module reference
    does not import). One that fails here may have needed state of the statements that do
    not run again (``sys.path.insert`` before it): the capsule imports every module it
    refers to by itself, and says so if one cannot be found."""
    for code in codes:
        try:
            exec(code, ns)
        except ImportError:
            pass


def resume(
    capsule_id: str,
    *,
    repo: Any = None,
    on_capsule: Callable[[pause.PauseEvent], None] | None = None,
    on_refusal: Callable[[pause.PauseRefusal], None] | None = None,
    files_to: PathLike = ".",
    labels: dict[str, Any] | None = None,
    signals: dict[int, tuple[str, float | None, str]] | None = None,
    scan_interval: float | None = 600.0,
    run: bool = True,
    on_oom: Callable[[BaseException], None] | None = None,
    files: str | None = None,
    before_run: Callable[[], None] | None = None,
    on_edit: Callable[[list[dict[str, Any]]], None] | None = None,
    verify: Callable[[str, float | None], str | None] | None = None,
) -> Any:
    """Carry on, in this (fresh) process, the program paused in capsule ``capsule_id``.

    Returns 0 when the program ends (or, with ``run=False``, a :class:`Resumed` once everything
    is restored and checked, without running anything). Later pauses write capsules whose parent
    is ``capsule_id``, with the files under ``files`` when given (like ``run_script``).
    ``before_run()`` is called once everything is restored and checked, before the first
    statement runs. Sources edited since the capture are accepted where the edit leaves the
    paused program's frames alone (:mod:`sojourn.execution.edits`): their diffs are printed,
    and ``on_edit(changes)`` gets one dict per changed file (path, lines added and removed,
    the unified diff) before the first statement runs.
    """
    import time

    from sojourn.capsule import format as fmt
    from sojourn.capsule.environment import refuse_missing
    from sojourn.capsule.restore import restore_capsule
    from sojourn.errors import MissingLibraryError
    from sojourn.execution.reducers import prime_rebuilt
    from sojourn.execution.resumeform import imports_code, module_resume_code
    from sojourn.execution.transform import REC
    from sojourn.repository.repo import open_repository

    t0 = time.perf_counter()
    with open_repository(repo) as r:
        manifest = fmt.load_manifest(r, capsule_id)
        info = manifest.labels.get(LABEL)
        if not isinstance(info, dict):
            raise ResumeError(f"capsule {manifest.id} holds a namespace, not a paused program; "
                              "use sojourn.restore() to load it")
        if info.get("version") != FORMAT_VERSION or info.get("transform") != TRANSFORM_VERSION:
            raise ResumeError(f"capsule {manifest.id} was written by another version of sojourn's "
                              f"execution engine (format {info.get('version')}, transform "
                              f"{info.get('transform')}); resume it with that version")
        # Before the program's imports run again: a missing library is named in one line (as a
        # ResumeError, which the session reports as such), not a traceback.
        try:
            refuse_missing(manifest)
        except MissingLibraryError as e:
            raise ResumeError(str(e)) from None
        script = _find_script(info)
        changes = _check_sources(manifest.id, info, script)
        RUNTIME.remaps = {c.module: c.remap for c in changes}
        if changes:
            from sojourn.capsule.modules import accept_edited

            accept_edited({c.module for c in changes})  # their edited files, not the recorded source
        main = _prepare(script, info["argv"])
        tm = RUNTIME.load(_read_source(script), "__main__", str(script), main.__dict__)
        if "__main__" not in RUNTIME.remaps and tm.layout.digest != info["sources"]["__main__"]["digest"]:
            raise ResumeError(f"Python {sys.version.split()[0]} reads {script} into a different "
                              f"statement layout than Python {info['python']} did; resume it with that version")
        ctl = None
        if run:  # signals that arrive while the capsule loads are held until the program runs
            ctl = pause.start(_config(repo, on_capsule, on_refusal, manifest.id, files, labels, signals, scan_interval,
                                      on_oom, verify))
        _program_path(info, script)
        _import_again(imports_code(tm, int(info["main_top"])), main.__dict__)
        t_defs = time.perf_counter()
        RUNTIME.as_captured = True  # the fingerprint check re-pickles: name the code as the capsule does
        try:
            restored = restore_capsule(r, manifest.id, files_to=files_to, into=main.__dict__)
        finally:
            RUNTIME.as_captured = False
    state = restored.process[LABEL]
    for name, values in state["modules"].items():
        RUNTIME.module(name).namespace.update(values)
    prime_rebuilt()
    main_rec = state["main"]
    code = module_resume_code(tm, main_rec)
    RUNTIME.main_codes.add(code)
    main.__dict__[REC] = main_rec
    t_end = time.perf_counter()
    if not run:
        notes = [f"{c.path} changed since the capture (+{c.added} -{c.removed} lines), outside the paused "
                 "program's frames: a resume runs the new code" for c in changes]
        return Resumed(manifest.id, sys.version.split()[0], info.get("where", ""), [*restored.notes, *notes],
                       {"prepare": t_defs - t0, "restore": restored.timings.get("total", 0.0), "total": t_end - t0},
                       [c.event() for c in changes])
    from sojourn.execution import libiters, loaders

    loaders.materialize()  # DataLoader iterators: replayed now, their workers started
    libiters.materialize()  # library generators in loops: called again and advanced
    if before_run is not None:  # restored and checked: a move's destination waits for its go here
        before_run()
    for note in restored.notes:
        print(f"sojourn: {note}", file=sys.stderr)
    if changes:
        _say_changes(manifest.id, changes)
        if on_edit is not None:
            on_edit([c.event() for c in changes])
    assert ctl is not None
    ctl.enabled = True
    _run(ctl, code, main.__dict__)
    return 0
