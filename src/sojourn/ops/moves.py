"""The service layer for ``sojourn move WS --to MACHINE``: a live move (docs/moves.md).

This side launches the destination through the machine's provider (the same path as ``run
--on MACHINE --detach``) and watches: the destination asks the source to pause
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

    from sojourn.providers.base import Offer
    from sojourn.workspace.machine import MachineSpec
    from sojourn.workspace.store import WorkspaceStore

# Module names of the big libraries a session may hold, by distribution: the destination
# imports them while it waits, so that the restore does not pay for it while paused.
START_LIMIT = 240.0  # seconds a destination may take to start up and ask for the pause
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
    provider: str = "local"
    scratch: str | None = None  # the destination's scratch directory (None: the workspace's own directory)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Target:
    """Where the destination runs: a machine (through its provider, in a scratch directory
    with the workspace's files), or, for ``--to local``/``--to PYTHON`` of a workspace that
    does not run on a machine, this host in the workspace's own directory (``in_place``)."""

    machine: MachineSpec
    offer: Offer | None
    in_place: str | None = None


def _target(store: WorkspaceStore, to: str, rec: Any, max_duration: float | None = None) -> Target:
    """``--to``: ``local`` (this host, the interpreter the workspace runs with), a Python
    path or command, or a machine of the repository's machines config."""
    from dataclasses import replace

    from sojourn.ops.machines import machine_for
    from sojourn.workspace.errors import WorkspaceError
    from sojourn.workspace.liveness import hostname
    from sojourn.workspace.machine import MachineSpec

    current = rec.current
    on_machine = current is not None and current.scratch is not None
    python: str | None = None
    if to == "local":
        from sojourn.workspace.capsules import record_python

        python = None if on_machine else record_python(rec, current)
    elif os.sep in to or to.startswith("python"):
        from shutil import which

        path = to if os.sep in to else which(to)
        if not path or not os.access(path, os.X_OK):
            raise WorkspaceError(f"no Python interpreter {to!r}: give `local`, a machine name or a Python path")
        python = os.path.abspath(path)
    else:
        spec, offer = machine_for(store.repo, to, max_duration)
        return Target(spec, offer)
    if on_machine:  # it runs in a scratch directory: so does the destination, on the `local` machine
        spec, offer = machine_for(store.repo, "local", max_duration)
        return Target(replace(spec, python=python) if python else spec, offer)
    cwd = rec.command.cwd if os.path.isdir(rec.command.cwd) else os.getcwd()
    return Target(MachineSpec(name=hostname(), python=python or sys.executable, max_duration=max_duration), None,
                  in_place=cwd)


def launch_destination(argv: list[str], log: Path) -> Callable[[], bool]:
    """Start an in-place destination's supervisor detached (its own session, its output in
    ``log``); returns "is it still running". A machine's destination is launched by its
    provider instead (:func:`_launch`)."""
    from sojourn.workspace.capsules import child_env

    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, env=child_env(), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, cwd="/")
    return lambda: proc.poll() is None


def _launch(store: WorkspaceStore, ws: str, al: str, source: str, target: Target,
            argv: list[str]) -> tuple[Callable[[], bool], str]:
    """Launch the destination's supervisor through the machine's provider, exactly as
    ``run --on MACHINE --detach`` does; returns "is it still running" and its log."""
    from sojourn.providers.base import LaunchFailed, LaunchSpec, get_provider
    from sojourn.workspace.errors import WorkspaceError

    m = target.machine
    assert target.offer is not None
    provider = get_provider(m.provider, store.repo)
    from sojourn.ops.policy import checked_launch

    try:  # issue 6: the four checks, as launch-check events
        handle = checked_launch(store, ws, al, provider, target.offer, LaunchSpec(ws, al, argv, hard_stop=m.max_duration,
                                                                                  cwd=str(m.scratch_for(al))))
    except LaunchFailed as e:
        raise WorkspaceError(f"not moved: the destination could not be launched on machine {m.name} ({e.check}): "
                             f"{e}; the program keeps running in {source}") from e
    return (lambda: provider.status(handle) != "ended"), str(handle.data.get("log") or "")


def move(workspace: str, to: str, *, repo: PathLike | None = None, deadline: float = 600.0,
         timeout: float | None = None, wait: float | None = None, max_duration: str | float | None = None,
         on_progress: Callable[[str, dict[str, Any]], None] | None = None, build_env: bool = False,
         env_mode: str = "exact") -> MoveResult:
    """Move a running workspace, live, to ``to``. Returns once the destination runs the program,
    or once the move failed (the program then keeps running where it was). ``deadline``:
    seconds the program may take to reach a statement where it can pause; ``timeout``: seconds
    the source waits for the destination's restore (default: from the capsule's size);
    ``max_duration``: the destination's hard stop (default: the machine's)."""
    from sojourn.repository.repo import sojourn_home
    from sojourn.workspace import files
    from sojourn.workspace import records as R
    from sojourn.workspace.authority import reap
    from sojourn.workspace.errors import WorkspaceError
    from sojourn.workspace.faults import fault
    from sojourn.workspace.incoming import incoming_argv
    from sojourn.workspace.machine import parse_duration

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
        target = _target(store, to, rec, parse_duration(max_duration))
        if target.machine.provider == "local" and (build_env or target.machine.python != sys.executable):
            # The destination interpreter is checked against (or given) the environment of the
            # workspace's last capsule (sojourn's own alone before the first) before anything
            # is launched; the move's own capsule is checked by the destination's restore.
            from dataclasses import replace

            from sojourn.ops.environment import prepare_python

            last = rec.last_capsule.id if rec.last_capsule is not None else None
            py = prepare_python(store.repo, last, target.machine.python, build_env=build_env, mode=env_mode)
            target = replace(target, machine=replace(target.machine, python=py))
        m = target.machine
        move_id, al = R.new_id("mv"), R.new_id("al")
        preload = sorted({_PRELOAD[d] for d in (rec.requirements.get("packages") or {}) if d in _PRELOAD})
        files_from = None
        if target.in_place is None and not rec.files:
            # The workspace carries no files (it does not run on a machine): a snapshot of its
            # directory goes with it, taken now, while the program runs.
            if not os.path.isdir(rec.command.cwd):
                raise WorkspaceError(f"workspace {ws} carries no files and its directory {rec.command.cwd} is not on "
                                     f"this host: run `sojourn move` where it runs")
            files_from = files.snapshot(store.repo, rec.command.cwd, workspace=ws).capsule
        argv = incoming_argv(sys.executable, repo=store.repo.url, workspace=ws, move=move_id, allocation=al,
                             epoch=rec.epoch, source=a.id, machine=m, in_place=target.in_place,
                             files_from=files_from, deadline=deadline, timeout=timeout, preload=preload)
        fault("move.cli.before-launch")
        if target.in_place is not None:
            log = str(sojourn_home() / "moves" / f"{move_id}.log")
            running = launch_destination(argv, Path(log))
        else:
            running, log = _launch(store, ws, al, a.id, target, argv)
        fault("move.cli.after-launch")
        scratch = None if target.in_place is not None else str(m.scratch_for(al))
        if on_progress:
            on_progress("launched", {"move": move_id, "allocation": al, "machine": m.name, "provider": m.provider,
                                     "scratch": scratch, "log": log})
        res = _wait(store, ws, rec, move_id, a.id, al, running, wait, on_progress)
        return MoveResult(ws, move_id, res["moved"], a.id, al, m.name, m.python, res.get("capsule"),
                          res.get("paused_ms"), time.monotonic() - t0, store.record(ws, save=False).state,
                          res["message"] + ("" if res["moved"] or not log else f" (destination's log: {log})"),
                          m.provider, scratch)


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
    from sojourn.workspace.migrate import LeaseWatch, get_marker
    from sojourn.workspace.records import describe_event

    lease, ready = LeaseWatch(store, ws, move), None  # a destination that dies before it asks
    cursor, epoch = rec.upto, rec.epoch
    committed: dict[str, Any] | None = None
    t_commit = 0.0
    t0 = time.monotonic()
    dead_since: float | None = None
    asked = False  # the destination asked the source to pause
    source_moved: tuple[dict[str, Any], float] | None = None  # the source's `moved` stop, seen before the commit
    while True:
        for ev in store.events(ws, cursor + 1):
            cursor = int(ev["seq"])
            kind = ev.get("type")
            if kind == "request" and ev.get("move") == move:
                asked = True
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
                    # The source records its side once it sees the destination's epoch; the
                    # destination's own event may land just after it: wait a little for it.
                    source_moved = source_moved or (ev, time.monotonic())
                    continue
                return {"moved": False, "message": f"not moved: the source stopped first ({ev.get('reason')}: "
                                                   f"{ev.get('detail')}); the workspace is {ev.get('state')}"}
        if committed is None and source_moved is not None and (time.monotonic() - source_moved[1] > 5.0
                                                               or not running()):
            ev = source_moved[0]
            return {"moved": False, "capsule": ev.get("capsule"),
                    "message": f"the destination won the workspace but did not record it (it died?); the "
                               f"workspace is suspended on capsule {ev.get('capsule')}: `sojourn resume {ws}`"}
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
        ready = ready or get_marker(store, ws, move, "ready")
        expired = lease.expired(ready) if not asked and committed is None else None
        if expired and not _requested(store, ws, epoch, move):  # (once it asked, the source settles it)
            return {"moved": False, "message": f"not moved: {expired}; it had not asked for the pause, so nothing "
                                               f"was paused and the program keeps running in {source}"}
        if not asked and committed is None and time.monotonic() - t0 > START_LIMIT:
            # A destination on another host that died while starting says nothing; this side
            # stops watching (nothing was paused, the program runs on where it was).
            return {"moved": False, "message": f"not moved: the destination did not ask the source to pause within "
                                               f"{START_LIMIT:.0f} s of its launch; the program keeps running in "
                                               f"{source} (`sojourn show {ws}` tells if the move goes on later)"}
        if wait is not None and time.monotonic() - t0 > wait:
            return {"moved": False, "message": f"no outcome within {wait:g} s; the move goes on without this "
                                               f"command, `sojourn show {ws}` tells how it ends"}
        time.sleep(0.02)
