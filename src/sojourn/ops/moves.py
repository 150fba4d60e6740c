"""The service layer for ``sojourn move WS --to MACHINE``: a live move (docs/moves.md).

This side only starts the destination and watches: the destination asks the source to pause
once it is warm, and the two settle the move through the repository. Killing this command at
any step changes nothing about the outcome; ``sojourn show`` tells it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sojourn.ops.workspaces import PathLike, _Workspaces

if TYPE_CHECKING:
    from collections.abc import Callable

    from sojourn.workspace.store import WorkspaceStore

# Module names of the big libraries a session may hold, by distribution: the destination
# imports them while it waits, so that the restore does not pay for it while paused.
_PRELOAD = {"numpy": "numpy", "torch": "torch", "pandas": "pandas", "scipy": "scipy", "scikit-learn": "sklearn"}


@dataclass
class MoveResult:
    workspace: str
    move: str
    moved: bool
    source: str  # allocation
    destination: str  # allocation
    machine: str
    python: str
    capsule: str | None
    paused_ms: float | None
    seconds: float
    state: str  # the workspace's state afterwards
    message: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Target:
    machine: str
    provider: str
    python: str
    memory: int | None


def _target(store: WorkspaceStore, to: str, rec: Any) -> Target:
    """``--to``: ``local`` (this host, the interpreter the workspace runs with), a Python
    path or command, or a machine of the repository's machines config."""
    from sojourn.workspace.errors import WorkspaceError
    from sojourn.workspace.liveness import hostname

    current = rec.current
    if to == "local":
        return Target(hostname(), "local", current.python if current else sys.executable, None)
    if os.sep in to or to.startswith("python"):
        from shutil import which

        path = to if os.sep in to else which(to)
        if not path or not os.access(path, os.X_OK):
            raise WorkspaceError(f"no Python interpreter {to!r}: give `local`, a machine name or a Python path")
        return Target(hostname(), "local", os.path.abspath(path), None)
    try:
        from sojourn.providers.machines import get_machine, machine_spec
    except ImportError:
        raise WorkspaceError(f"no machine {to!r}: give `local` or a Python path") from None
    m = machine_spec(get_machine(store.repo, to))
    return Target(m.name, m.provider, m.python, m.memory)


def launch_destination(argv: list[str], log: Path) -> Callable[[], bool]:
    """Start the destination's supervisor detached (its own session, its output in ``log``);
    returns "is it still running". The one place that knows how: a provider's launch
    replaces it for remote machines."""
    from sojourn.workspace.capsules import child_env

    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, env=child_env(), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, cwd="/")
    return lambda: proc.poll() is None


def move(workspace: str, to: str, *, repo: PathLike | None = None, deadline: float = 600.0,
         timeout: float | None = None, wait: float | None = None,
         on_progress: Callable[[str, dict[str, Any]], None] | None = None) -> MoveResult:
    """Move a running workspace, live, to ``to``. Returns once the destination runs the program,
    or once the move failed (the program then keeps running where it was). ``deadline``:
    seconds the program may take to reach a statement where it can pause; ``timeout``: seconds
    the source waits for the destination's restore (default: from the capsule's size)."""
    from sojourn.repository.repo import sojourn_home
    from sojourn.workspace import records as R
    from sojourn.workspace.authority import reap
    from sojourn.workspace.errors import WorkspaceError
    from sojourn.workspace.faults import fault
    from sojourn.workspace.migrate import incoming_argv

    t0 = time.monotonic()
    with _Workspaces(repo) as store:
        ws = store.resolve(workspace)
        rec = reap(store, store.record(ws), by="sojourn move")
        a = rec.current
        if rec.state != "running" or a is None:
            hint = f"`sojourn resume {ws}` starts it" if rec.state == "suspended" else rec.next_action.hint
            raise WorkspaceError(f"workspace {ws} is not running ({rec.state}); a live move needs a running "
                                 f"session: {hint}")
        if rec.pending:
            raise WorkspaceError(f"workspace {ws} is serving a {rec.pending.get('kind')} request already; "
                                 "try again once it is done")
        target = _target(store, to, rec)
        move_id, al = R.new_id("mv"), R.new_id("al")
        preload = sorted({_PRELOAD[d] for d in (rec.requirements.get("packages") or {}) if d in _PRELOAD})
        cwd = rec.command.cwd if os.path.isdir(rec.command.cwd) else os.getcwd()
        argv = incoming_argv(sys.executable, repo=store.repo.url, workspace=ws, move=move_id, allocation=al,
                             epoch=rec.epoch, source=a.id, session_python=target.python, cwd=cwd,
                             machine=target.machine, provider=target.provider, memory=target.memory,
                             deadline=deadline, timeout=timeout, preload=preload)
        fault("move.cli.before-launch")
        log = sojourn_home() / "moves" / f"{move_id}.log"
        running = launch_destination(argv, log)
        fault("move.cli.after-launch")
        if on_progress:
            on_progress("launched", {"move": move_id, "allocation": al, "machine": target.machine, "log": str(log)})
        res = _wait(store, ws, rec, move_id, a.id, al, running, wait, on_progress)
        return MoveResult(ws, move_id, res["moved"], a.id, al, target.machine, target.python, res.get("capsule"),
                          res.get("paused_ms"), time.monotonic() - t0, store.record(ws, save=False).state,
                          res["message"] + ("" if res["moved"] else f" (destination's log: {log})"))


def _requested(store: WorkspaceStore, ws: str, epoch: int, move: str) -> bool:
    """Whether the destination wrote its request (then the source settles the move)."""
    from sojourn.workspace.store import KIND

    for name in store.backend.list(KIND, f"request.{ws}.{epoch}."):
        n = int(name.rsplit(".", 1)[1])
        req = store.poll_request(ws, epoch, n)
        if req is not None and req.get("move") == move:
            return True
    return False


def _wait(store: WorkspaceStore, ws: str, rec: Any, move: str, source: str, dest: str, running: Callable[[], bool],
          wait: float | None, on_progress: Callable[[str, dict[str, Any]], None] | None) -> dict[str, Any]:
    """Watch the log for the outcome: the commit (an ``authority`` event of this move), a
    ``move`` event, or the source ending some other way; and the destination failing first."""
    from sojourn.workspace.faults import fault
    from sojourn.workspace.migrate import get_marker
    from sojourn.workspace.records import describe_event

    cursor, epoch = rec.upto, rec.epoch
    committed: dict[str, Any] | None = None
    t_commit = 0.0
    t0 = time.monotonic()
    dead_since: float | None = None
    while True:
        for ev in store.events(ws, cursor + 1):
            cursor = int(ev["seq"])
            kind = ev.get("type")
            if kind == "request" and ev.get("move") == move:
                fault("move.cli.after-request")
                if on_progress:
                    on_progress("requested", ev)
            elif kind == "authority" and ev.get("move") == move and ev.get("holder") == dest:
                committed, t_commit = ev, time.monotonic()
                fault("move.cli.after-commit")
            elif kind == "move" and ev.get("move") == move:
                if ev.get("outcome") == "moved":
                    return {"moved": True, "capsule": ev.get("capsule"), "paused_ms": ev.get("paused_ms"),
                            "message": describe_event(ev)}
                return {"moved": False, "capsule": ev.get("capsule"),
                        "message": f"not moved: {ev.get('reason')}; the program keeps running in {source}"}
            elif kind == "stopped" and ev.get("allocation") == source and committed is None and int(
                    ev.get("epoch", 0)) >= epoch:
                if ev.get("reason") == "moved":
                    return {"moved": False, "capsule": ev.get("capsule"),
                            "message": f"the destination won the workspace but did not record it (it died?); the "
                                       f"workspace is suspended on capsule {ev.get('capsule')}: `sojourn resume {ws}`"}
                return {"moved": False, "message": f"not moved: the source stopped first ({ev.get('reason')}: "
                                                   f"{ev.get('detail')}); the workspace is {ev.get('state')}"}
        if committed is not None and (time.monotonic() - t_commit > 3.0 or not running()):
            ok = running()
            return {"moved": ok, "capsule": committed.get("capsule", {}).get("id"), "paused_ms": None,
                    "message": f"moved to {dest}" if ok else
                    f"the destination {dest} won the workspace, then ended; `sojourn show {ws}` tells the rest"}
        failed = get_marker(store, ws, move, "dest")
        if failed is not None and not failed.get("requested"):
            return {"moved": False, "message": f"not moved: {failed.get('error')}; the program keeps running in "
                                               f"{source}"}
        if committed is None and not running():
            dead_since = dead_since or time.monotonic()
            if not _requested(store, ws, epoch, move) or time.monotonic() - dead_since > 30.0:
                why = (failed or {}).get("error") or "the destination's supervisor ended"
                return {"moved": False, "message": f"not moved: {why}; `sojourn show {ws}` tells the rest"}
        if wait is not None and time.monotonic() - t0 > wait:
            return {"moved": False, "message": f"no outcome within {wait:g} s; the move goes on without this "
                                               f"command, `sojourn show {ws}` tells how it ends"}
        time.sleep(0.02)
