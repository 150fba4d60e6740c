"""The console's actions, each one ``ops`` call: what the confirmation page says and what
the POST does. A resume always detaches: the program must not live inside the console."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sojourn import ops


@dataclass
class Outcome:
    workspace: str  # the page to go back to (a fork's is the new workspace)
    message: str


@dataclass(frozen=True)
class Action:
    label: str
    warning: str  # what the confirmation page says will happen
    needs_running: bool
    machine: bool  # the form asks for a machine
    run: Callable[[str, str | None, dict[str, str]], Outcome]

    def do(self, ws: str, repo: str | None, fields: dict[str, str]) -> Outcome:
        return self.run(ws, repo, fields)


def _suspend(ws: str, repo: str | None, f: dict[str, str]) -> Outcome:
    r = ops.suspend(ws, repo=repo)
    return Outcome(r.workspace, f"suspended: capsule {r.capsule.id} ({r.seconds:.1f} s)")


def _resume(ws: str, repo: str | None, f: dict[str, str]) -> Outcome:
    r = ops.resume(ws, repo=repo, on=f.get("machine") or None, detach=True)
    assert isinstance(r, ops.DetachedSession)  # detach=True
    return Outcome(r.workspace, f"resumed on {r.machine} in allocation {r.allocation}"
                                + (f" from capsule {r.capsule}" if r.capsule else ""))


def _move(ws: str, repo: str | None, f: dict[str, str]) -> Outcome:
    from sojourn.errors import SojournError
    from sojourn.ops.moves import move

    to = f.get("machine", "")
    if not to:
        raise SojournError("pick the machine to move to")
    r = move(ws, to, repo=repo)
    if not r.moved:
        raise SojournError(f"not moved: {r.message}")
    paused = f", paused {r.paused_ms:.0f} ms" if r.paused_ms is not None else ""
    return Outcome(r.workspace, f"moved to {r.machine} (allocation {r.destination}{paused})")


def _checkpoint(ws: str, repo: str | None, f: dict[str, str]) -> Outcome:
    r = ops.checkpoint(ws, repo=repo)
    return Outcome(r.workspace, f"checkpoint: capsule {r.capsule.id} ({r.seconds:.1f} s); the program keeps running")


def _fork(ws: str, repo: str | None, f: dict[str, str]) -> Outcome:
    r = ops.fork(ws, repo=repo, name=f.get("name") or None)
    return Outcome(r.workspace, f"forked from {r.source} at capsule {r.capsule}: {r.state}; resume it to run it")


ACTIONS: dict[str, Action] = {
    "suspend": Action("Suspend", "The program pauses at its next statement, writes a capsule and stops; "
                      "its machine is released. Resume carries it on.", True, False, _suspend),
    "resume": Action("Resume on…", "The workspace carries on from its last good capsule, in the background "
                     "on the machine you pick (it costs that machine's price while it runs).", False, True, _resume),
    "move": Action("Move to…", "The program pauses between two statements, its capsule is written and it "
                   "carries on on the machine you pick; the source stops once the destination runs.",
                   True, True, _move),
    "checkpoint": Action("Checkpoint", "The program writes a capsule at its next statement and keeps running.",
                         True, False, _checkpoint),
    "fork": Action("Fork", "A new workspace that carries on from this one's last good capsule, suspended; "
                   "this one is untouched.", False, False, _fork),
}


def available(state: str) -> list[tuple[str, Action]]:
    """The actions that apply to a workspace in ``state``."""
    out: list[tuple[str, Any]] = []
    for name, a in ACTIONS.items():
        if a.needs_running and state != "running":
            continue
        if name == "resume" and state not in ("suspended", "failed"):
            continue
        out.append((name, a))
    return out
