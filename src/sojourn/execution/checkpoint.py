"""From a paused position to a capsule: the checks, the capture, and what resume reads first.

The capsule holds the main script's globals as its namespace and, in its process segment
(pickled with the same memo, so aliasing between the stack and the globals survives), the
position: the main frame's record, which links to every frame it waits for, and the globals
of the program's other modules. Its manifest labels carry, as JSON, what a resume needs
*before* anything is unpickled: the sources and their hashes and layout digests, the argv,
and where the main script stands (which top-level imports to run again).
"""

from __future__ import annotations

import os
import platform
import sys
import threading
import time
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sojourn import threads
from sojourn.errors import Problem
from sojourn.execution import position
from sojourn.execution.autograd import direct_live, live_graphs, released_bindings
from sojourn.execution.names import path_names
from sojourn.execution.position import Deferred, Position, Refused
from sojourn.execution.reducers import frame_entry, set_capture
from sojourn.execution.runtime import Runtime
from sojourn.execution.transform import TRANSFORM_VERSION

if TYPE_CHECKING:
    from sojourn.execution.pause import PauseConfig, PauseEvent, _Request

LABEL = "sojourn.execution"
FORMAT_VERSION = 2  # 2: no definition of the main script runs again on resume


def position_at(rt: Runtime, frame: types.FrameType, sid: int) -> Position:
    return position.capture(rt, frame, sid)


def main_top(rt: Runtime, pos: Position) -> int:
    assert rt.main is not None
    return rt.main.layout.stmts[pos.main.sid].path[0][1]


def _skipped(name: str) -> bool:
    from sojourn.capsule.capture import skipped

    return skipped(name) or name.startswith("__sojourn")


def module_globals(rt: Runtime) -> dict[str, dict[str, Any]]:
    """The globals of every transformed module but the main script (whose are the namespace)."""
    out = {}
    for name, tm in rt.modules.items():
        if tm is rt.main:
            continue
        out[name] = {k: v for k, v in tm.namespace.items() if isinstance(k, str) and not _skipped(k)}
    return out


def _roots(rt: Runtime, pos: Position) -> dict[str, Any]:
    assert rt.main is not None
    roots: dict[str, Any] = {k: v for k, v in rt.main.namespace.items() if isinstance(k, str) and not _skipped(k)}
    for rec in pos.records:
        for k, v in (rec.locals or {}).items():
            roots[f"<{rec.where}>.{k}"] = v
    for mod, ns in module_globals(rt).items():
        for k, v in ns.items():
            roots[f"{mod}.{k}"] = v
    return roots


def check_autograd(rt: Runtime, pos: Position) -> None:
    """Defer while a tensor's autograd graph is live: first the variables themselves (cheap, at
    every attempt), then everything reachable (once the variables are clear)."""
    if "torch" not in sys.modules:
        return
    assert rt.main is not None
    scopes = [("", rt.main.namespace)] + [(f"<{r.where}>.", r.locals) for r in pos.records if r.locals is not None]
    found = direct_live(scopes)
    deep = False
    if not found:
        found = live_graphs(_roots(rt, pos))
        deep = True
    if found:
        names = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
        d = Deferred(f"{names}: autograd graph that backward() has not used yet; a capsule "
                     "cannot carry the graph, so the pause waits for backward() (or `del` / .detach())")
        d.backoff = deep  # type: ignore[attr-defined]
        raise d


def check_threads() -> None:
    """A live non-daemon thread cannot be moved: refuse. (Daemon threads are library helpers,
    such as tqdm's monitor; they are not carried and not restarted.)"""
    main = threading.main_thread()
    problems = []
    for t in threading.enumerate():
        if t is main or not t.is_alive() or t.daemon or t.name.startswith("sojourn-"):
            continue
        target = getattr(t, "_target", None)
        what = getattr(target, "__qualname__", None) or type(t).__qualname__
        problems.append(Problem(f"<thread {t.name!r}>", f"{type(t).__module__}.{type(t).__qualname__}",
                                f"a running thread ({what}) cannot be moved; join it before the pause, "
                                "or start it again after resume"))
    if problems:
        raise Refused(f"{len(problems)} thread(s) are running besides the main thread", problems)


def label_data(rt: Runtime, pos: Position, reason: str) -> dict[str, Any]:
    assert rt.main is not None
    script = rt.main.filename
    try:
        rel = os.path.relpath(script)
    except ValueError:
        rel = script
    return {
        "version": FORMAT_VERSION,
        "transform": TRANSFORM_VERSION,
        "python": platform.python_version(),
        "script": script,
        "script_rel": None if rel.startswith("..") else rel,
        "argv": list(sys.argv),
        "sys_path": list(sys.path),
        "main_top": main_top(rt, pos),
        "where": pos.describe(),
        "reason": reason,
        "sources": {
            name: {"path": tm.filename, "sha256": tm.layout.sha256, "digest": tm.layout.digest, "text": tm.source}
            for name, tm in rt.modules.items()
        },
        # The frames that carry on from a statement (generators are added as they are
        # pickled): a resume from an edited source checks that the edit leaves them alone.
        "frames": [frame_entry(r) for r in pos.records],
    }


def write_capsule(rt: Runtime, pos: Position, config: PauseConfig, req: _Request, t_check: float,
                  low_memory: bool = False) -> PauseEvent:
    from sojourn.capsule.capture import capture_namespace
    from sojourn.execution.pause import PauseEvent
    from sojourn.repository.repo import open_repository

    assert rt.main is not None
    modules = module_globals(rt)
    extra = {LABEL: {"version": FORMAT_VERSION, "main": pos.main, "modules": modules}}
    labels = {**config.labels, LABEL: label_data(rt, pos, req.reason)}
    # Tensors whose graph backward() consumed travel as values: swapped in for the capture (the
    # main script's globals are put back afterwards, should the program carry on).
    scopes = [rt.main.namespace, *(r.locals for r in pos.records if r.locals is not None), *modules.values()]
    swaps = released_bindings(scopes)
    originals = [(scope, name, scope[name]) for scope, name, _ in swaps]
    for scope, name, detached in swaps:
        scope[name] = detached
    t0 = time.perf_counter()
    set_capture(pos, labels[LABEL]["frames"])
    try:
        # Created only when there was none at the start (a first capture through the API); a
        # repository that was there and vanished or was replaced is refused (RepositoryChanged).
        with open_repository(config.repo, create=config.repo_id is None, expect_id=config.repo_id) as repo:
            if low_memory:
                # After an out-of-memory error: each writer thread costs a stack, and a
                # failed thread start would lose the capsule; two keep a disk busy enough.
                repo.chunks.workers = min(repo.chunks.workers, 2)
            m = capture_namespace(rt.main.namespace, repo, files=config.files, parent=config.parent,
                                  labels=labels, extra=extra, paths=path_names(rt, pos))
    finally:
        set_capture(None)
        for scope, name, value in originals:
            scope[name] = value
    return PauseEvent(m.id, m.parent, req.reason, pos.describe(), m.size, t_check - req.t0,
                      time.perf_counter() - t0, req.action, t_check)


def scan_state(rt: Runtime, pos: Position, rehearse: bool = True) -> list[Problem]:
    """What a pause here would refuse, without writing anything (the periodic early warning);
    ``rehearse``: also what the capsule's write check would refuse (sojourn.capsule.probe)."""
    from sojourn.capsule.scan import scan

    ns, label = _scan_roots(rt, pos)
    set_capture(pos)
    try:
        return scan(ns, label=label, rehearse=rehearse)
    finally:
        set_capture(None)


def _scan_roots(rt: Runtime, pos: Position) -> tuple[dict[str, Any], Any]:
    # Everything a capture pickles (the frames' locals and the other modules' globals are
    # in its process segment), each under a name in the program's words.
    assert rt.main is not None
    first, label = path_names(rt, pos)
    ns = {**{k: v for k, v in rt.main.namespace.items() if isinstance(k, str) and not _skipped(k)}, **first}
    return ns, label


_REHEARSING = threading.Event()  # one child at a time: a short scan interval must not pile them up


def rehearse_in_background(rt: Runtime, pos: Position, warn: Callable[[list[Problem]], None],
                           log: Callable[[str], None]) -> None:
    """Rehearse the write check of a pause here (fork now, at this statement boundary); a
    thread waits for the child and calls ``warn`` with what it found."""
    if _REHEARSING.is_set():
        return
    wait = rehearse_state(rt, pos)
    if wait is None:
        return
    _REHEARSING.set()

    def waiter() -> None:
        try:
            problems = wait()
        except Exception as e:
            log(f"the rehearsal of the write check failed: {type(e).__name__}: {e}")
            return
        finally:
            _REHEARSING.clear()
        if problems:
            warn(problems)

    # Without a thread (`ulimit -v`) the child is waited for here: it must not stay a zombie.
    threads.start_or_run(waiter, name="sojourn-rehearse")


def rehearse_state(rt: Runtime, pos: Position) -> Callable[[], list[Problem]] | None:
    """Start rehearsing the write check of a pause here in a forked child (the program goes
    on meanwhile); the function returned waits for its findings. None: not possible here."""
    from sojourn.capsule import probe
    from sojourn.capsule.scan import differences

    ns, label = _scan_roots(rt, pos)
    set_capture(pos)
    try:
        child = probe.start(ns)
    finally:
        set_capture(None)
    if child is None:
        return None
    return lambda: differences(ns, child.result(), label)
