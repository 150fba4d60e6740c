"""The workspace record: what the event log folds into.

The event log is the truth; every other workspace object (the summary, ``ps``'s rows) is a
cache of this fold. An event is a small JSON object with a sequence number, a time, the
epoch of the writer and a type. The fold applies events in sequence order and ignores the
events of a stale writer: one whose epoch is below an ``authority`` event already applied.
A takeover is therefore linearised at the position of its ``authority`` event in the log:
what the old holder appended before it counts, what it appends after it does not.

Nothing here does I/O: the store (``store.py``) reads and writes the objects.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from sojourn.workspace.signing import link_of

STATES = ("running", "suspended", "finished", "failed")
STOP_REASONS = ("finished", "suspended", "moved", "preempted", "oom", "hard-stop", "failed")
RECORD_FORMAT = 2  # 1: unsigned records (read, flagged); 2: signed and chained (docs/records-format.md)


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(6)}"


def now() -> float:
    return round(time.time(), 3)


@dataclass
class Command:
    """What the workspace runs: the script as given, its arguments, where and with what."""

    script: str
    argv: list[str]
    cwd: str
    python: str


@dataclass
class CapsuleEntry:
    """A capsule a session of this workspace wrote, and whether it passed its write check."""

    id: str
    parent: str | None
    reason: str
    where: str
    size: int
    time: float
    allocation: str
    verified: bool
    error: str | None = None


@dataclass
class Allocation:
    """One lease of one machine: here, one supervised process tree on one host."""

    id: str
    provider: str
    machine: str
    host: str
    boot_id: str
    pid: int | None  # the supervisor (the `sojourn run`/`resume` process)
    pid_start: int | None
    python: str
    memory_limit: int | None
    started: float
    epoch: int
    capsule_in: str | None = None  # the capsule it resumed from
    session_pid: int | None = None
    session_pid_start: int | None = None
    python_version: str | None = None
    ended: float | None = None
    stop_reason: str | None = None
    detail: str = ""
    exit_code: int | None = None
    capsule_out: str | None = None
    max_rss: int | None = None  # bytes
    price_per_hour: float = 0.0
    spend: float = 0.0
    # Issue 4, machines: the offer it runs on (name, price, limits), its scratch directory,
    # the hard-stop deadline (unix time) and the provider's handle (pid, boot id, host...).
    offer: dict[str, Any] | None = None
    scratch: str | None = None
    hard_stop: float | None = None
    handle: dict[str, Any] | None = None
    output: str | None = None  # its session's output files on its host, less ".out"/".err" (logs.py)

    @property
    def open(self) -> bool:
        return self.ended is None


@dataclass
class NextAction:
    action: str  # "wait", "resume", "none", "run-again"
    capsule: str | None
    hint: str


@dataclass
class WorkspaceRecord:
    id: str
    name: str
    created: float
    command: Command
    state: str = "running"
    epoch: int = 0
    holder: str | None = None
    updated: float = 0.0
    stop_reason: str | None = None
    detail: str = ""
    exit_code: int | None = None
    last_capsule: CapsuleEntry | None = None
    capsules: list[CapsuleEntry] = field(default_factory=list)
    allocations: list[Allocation] = field(default_factory=list)
    requirements: dict[str, Any] = field(default_factory=dict)
    pending: dict[str, Any] | None = None  # the pause request being served, if any
    taker: dict[str, Any] | None = None  # host and process that took the current epoch
    refusals: int = 0
    upto: int = 0  # sequence number of the last event folded in
    files: dict[str, Any] | None = None  # the file manifest: the last `files` event (workspace/files.py)
    # Authentication (store.py, signing.py): the chain link of the last record folded in,
    # whether a signed one came (every later one must be), and how many were unsigned
    # (format 1: read and shown, never trusted to choose an interpreter or a capsule).
    head: str = field(default="", compare=False)
    signed: bool = False
    unsigned: int = 0

    @property
    def current(self) -> Allocation | None:
        """The allocation that holds the workspace now (open, of the current epoch)."""
        for a in reversed(self.allocations):
            if a.id == self.holder and a.open:
                return a
        return None

    @property
    def last_allocation(self) -> Allocation | None:
        return self.allocations[-1] if self.allocations else None

    def allocation(self, al: str) -> Allocation | None:
        for a in self.allocations:
            if a.id == al:
                return a
        return None

    @property
    def next_action(self) -> NextAction:
        cap = self.last_capsule.id if self.last_capsule else None
        if self.state == "running":
            return NextAction("wait", None, f"running; `sojourn suspend {self.id}` pauses it")
        if self.state == "suspended":
            more = " with more memory (without --memory, or a bigger --memory)" if self.stop_reason == "oom" else ""
            return NextAction("resume", cap, f"`sojourn resume {self.id}`{more} carries on from {cap}")
        if self.state == "finished":
            return NextAction("none", None, "finished")
        if cap:
            return NextAction("resume", cap, f"`sojourn resume {self.id}` carries on from the last good capsule {cap}")
        return NextAction("run-again", None, "no capsule to resume from: run the script again")

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["next_action"] = asdict(self.next_action)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> WorkspaceRecord:
        d = dict(d)
        d.pop("next_action", None)
        d["command"] = Command(**d["command"])
        d["capsules"] = [CapsuleEntry(**c) for c in d.get("capsules", [])]
        d["last_capsule"] = CapsuleEntry(**d["last_capsule"]) if d.get("last_capsule") else None
        d["allocations"] = [Allocation(**a) for a in d.get("allocations", [])]
        return cls(**d)


def state_after_stop(reason: str, capsule: str | None, ran: bool = True) -> str:
    """The one policy from how an allocation stopped to the workspace's state.

    A stop that left a capsule behind is resumable (suspended); a resume that failed before
    the program ran leaves the workspace on the capsule it started from.
    """
    if reason not in STOP_REASONS:
        raise ValueError(f"unknown stop reason {reason!r}")
    if reason == "finished":
        return "finished"
    if not ran and capsule:
        return "suspended"
    if reason == "failed":
        return "failed"
    return "suspended" if capsule else "failed"


# -- the fold ------------------------------------------------------------------------------


def initial(meta: dict[str, Any]) -> WorkspaceRecord:
    """The record of a workspace before any event (from its immutable ``meta`` object)."""
    return WorkspaceRecord(
        id=meta["id"],
        name=meta["name"],
        created=float(meta["created"]),
        command=Command(**meta["command"]),
        updated=float(meta["created"]),
        taker=meta.get("creator"),
        head=link_of(meta),
        signed="mac" in meta,
        unsigned=0 if "mac" in meta else 1,
    )


def is_stale(rec: WorkspaceRecord, event: dict[str, Any]) -> bool:
    return int(event.get("epoch", 0)) < rec.epoch


def apply(rec: WorkspaceRecord, event: dict[str, Any]) -> bool:
    """Fold one event into ``rec`` (in place). Returns False for a stale writer's event,
    which changes nothing. The event is read as its typed kind (``events.py``)."""
    from sojourn.workspace import events as E

    seq = int(event["seq"])
    if seq != rec.upto + 1:
        raise ValueError(f"event {seq} of {rec.id} folded out of order (after {rec.upto})")
    rec.upto = seq
    if is_stale(rec, event):
        return False
    t = float(event.get("t", 0.0))
    rec.updated = max(rec.updated, t)
    ev = E.parse(event)
    handler = _HANDLERS.get(type(ev).__name__)
    if handler is not None:
        handler(rec, ev, int(event.get("epoch", 0)), t)
    return True


def _authority(rec: WorkspaceRecord, ev: Any, epoch: int, t: float) -> None:
    rec.epoch = epoch
    rec.holder = ev.holder
    rec.pending = None
    rec.taker = {"host": ev.host, "boot_id": ev.boot_id, "pid": ev.pid, "pid_start": ev.pid_start}
    if str(rec.holder).startswith("al_"):
        # Taken to run: from this event on, no one else may resume it, even before the
        # allocation event that follows is written.
        rec.state = "running"
        rec.stop_reason = None
        rec.detail = ""
    if ev.extra.get("move") and isinstance(ev.extra.get("capsule"), dict):
        _moved_here(rec, ev, t)


def _moved_here(rec: WorkspaceRecord, ev: Any, t: float) -> None:
    """A move's commit is one event: the destination won the epoch after its restore checked
    the capsule, so the capsule is verified and the source allocation stopped as ``moved``
    (the source records the same, void once this is in; see docs/moves.md)."""
    from sojourn.workspace import events as E

    x = ev.extra
    _capsule(rec, E.CapsuleEvent(capsule=x["capsule"], distributions=x.get("distributions"), arch=x.get("arch")),
             0, t)
    src = rec.allocation(str(x.get("from_allocation")))
    if src is not None and src.open:
        src.ended = t
        src.stop_reason = "moved"
        src.spend = float(x.get("from_spend") or 0.0)
        src.detail = f"moved to {ev.holder} (move {x.get('move')}, epoch {rec.epoch})"


def _allocation(rec: WorkspaceRecord, ev: Any, epoch: int, t: float) -> None:
    rec.allocations.append(Allocation(**ev.allocation))
    rec.state = "running"
    rec.stop_reason = None
    rec.detail = ""
    rec.exit_code = None


def _started(rec: WorkspaceRecord, ev: Any, epoch: int, t: float) -> None:
    a = rec.allocation(ev.allocation)
    if a is None:
        return
    a.session_pid = ev.session_pid
    a.session_pid_start = ev.session_pid_start
    a.python_version = ev.python_version
    if ev.output:
        a.output = str(ev.output)
    for key in ("python", "arch", "platform"):
        if getattr(ev, key):
            rec.requirements[key] = getattr(ev, key)


def _request(rec: WorkspaceRecord, ev: Any, epoch: int, t: float) -> None:
    rec.pending = {"n": ev.n, "kind": ev.kind, "since": t, "by": ev.requested_by}


def _waiting(rec: WorkspaceRecord, ev: Any, epoch: int, t: float) -> None:
    if rec.pending is not None:
        rec.pending["waiting_for"] = ev.why


def _refused(rec: WorkspaceRecord, ev: Any, epoch: int, t: float) -> None:
    rec.pending = None
    rec.refusals += 1


def _capsule(rec: WorkspaceRecord, ev: Any, epoch: Any, t: float) -> None:
    entry = CapsuleEntry(**ev.capsule)
    known = [i for i, c in enumerate(rec.capsules) if c.id == entry.id]
    if known:  # a move's capsule, checked by the destination after the source wrote it
        rec.capsules[known[0]] = entry
    else:
        rec.capsules.append(entry)
    if entry.verified:
        rec.last_capsule = entry
        if ev.distributions:
            rec.requirements["packages"] = ev.distributions
        if ev.arch:
            rec.requirements["arch"] = ev.arch
    a = rec.allocation(entry.allocation)
    if a is not None and entry.verified:
        a.capsule_out = entry.id
    if ev.extra.get("checkpoint"):  # a requested checkpoint (workspace/checkpoints.py): the request is served
        rec.pending = None


def _stopped(rec: WorkspaceRecord, ev: Any, epoch: int, t: float) -> None:
    a = rec.allocation(ev.allocation) if ev.allocation is not None else None
    if a is not None and a.open:
        a.ended = t
        a.stop_reason = ev.reason
        a.detail = ev.detail or ""
        a.exit_code = ev.exit_code
        a.max_rss = ev.max_rss
        a.spend = float(ev.spend or 0.0)
        if a.max_rss:
            rec.requirements["memory_high_water"] = max(int(rec.requirements.get("memory_high_water", 0)), a.max_rss)
    if rec.current is None:
        rec.state = ev.state
        rec.stop_reason = ev.reason
        rec.detail = ev.detail or ""
        rec.exit_code = ev.exit_code
        rec.pending = None


def _files(rec: WorkspaceRecord, ev: Any, epoch: int, t: float) -> None:
    rec.files = {"capsule": ev.capsule, "source": ev.source, "count": ev.count, "bytes": ev.bytes,
                 "allocation": ev.allocation}


def _move(rec: WorkspaceRecord, ev: Any, epoch: int, t: float) -> None:
    rec.pending = None


# By event class name (events.KINDS): the fold's one table.
_HANDLERS = {
    "Files": _files,
    "Authority": _authority,
    "AllocationEvent": _allocation,
    "Started": _started,
    "Request": _request,
    "Waiting": _waiting,
    "Refused": _refused,
    "CapsuleEvent": _capsule,
    "Stopped": _stopped,
    "Move": _move,
}


def fold(meta: dict[str, Any], events: list[dict[str, Any]], base: WorkspaceRecord | None = None) -> WorkspaceRecord:
    rec = base if base is not None else initial(meta)
    for ev in events:
        apply(rec, ev)
    return rec


def describe_event(ev: dict[str, Any]) -> str:
    """One line for people (``sojourn show``)."""
    t = ev.get("type")
    if t == "created":
        c = ev.get("command", {})
        return f"created {ev.get('name')}: {c.get('script')} {' '.join(c.get('argv', []))}".rstrip()
    if t == "authority":
        return f"epoch {ev.get('epoch')} held by {ev.get('holder')} ({ev.get('reason', '')})"
    if t == "move":
        ms = f", paused {ev['paused_ms']:.0f} ms" if ev.get("paused_ms") is not None else ""
        why = f": {ev['reason']}" if ev.get("reason") else ""
        return f"move {ev.get('move')} {ev.get('outcome')} ({ev.get('source')} -> {ev.get('destination')}{ms}){why}"
    if t == "allocation":
        a = ev.get("allocation", {})
        src = f" from {a.get('capsule_in')}" if a.get("capsule_in") else ""
        return f"allocation {a.get('id')} on {a.get('provider')}:{a.get('machine')}{src}"
    if t == "started":
        return f"session pid {ev.get('session_pid')} on Python {ev.get('python_version')}"
    if t == "request":
        return f"{ev.get('kind')} requested by {ev.get('requested_by')}"
    if t == "waiting":
        return f"pause waiting ({ev.get('seconds', 0):.0f} s): {ev.get('why')}"
    if t == "refused":
        problems = ev.get("problems") or []
        extra = f" ({len(problems)} object(s))" if problems else ""
        return f"pause refused{extra}: {str(ev.get('message', '')).splitlines()[0] if ev.get('message') else ''}"
    if t == "capsule":
        c = ev.get("capsule", {})
        ok = "verified" if c.get("verified") else f"NOT verified: {c.get('error')}"
        return f"capsule {c.get('id')} ({c.get('reason')}) at {c.get('where')}, {ok}"
    if t == "stopped":
        detail = f": {ev['detail']}" if ev.get("detail") else ""
        return f"{ev.get('allocation')} stopped ({ev.get('reason')}{detail}) -> {ev.get('state')}"
    if t == "files":
        return f"files: {ev.get('count')} file(s), {ev.get('bytes')} bytes from {ev.get('source')} in {ev.get('capsule')}"
    if t == "policy":  # issue 6 (ops/policy.py): a decision, with its numbers in the event
        return f"policy {ev.get('policy')}: {ev.get('action')}" + (f" -> {ev['target']}" if ev.get("target") else "") \
            + f" ({ev.get('reason')})"
    if t == "policy-result":
        return f"policy {ev.get('policy')} {ev.get('action')} on {ev.get('machine')}: {ev.get('outcome')}"
    if t == "policy-settings":
        return "policy settings: " + ", ".join(f"{k}={v}" for k, v in sorted((ev.get("changed") or {}).items()))
    if t == "launch-check":
        return f"launch check {ev.get('check')} on {ev.get('provider')}:{ev.get('offer')}: {ev.get('outcome')}" + (
            f" ({ev['detail']})" if ev.get("detail") else "")
    if t == "edited":
        files = ", ".join(f"{f.get('path')} (+{f.get('added')} -{f.get('removed')})" for f in ev.get("files") or [])
        return f"resumed {ev.get('capsule')} with sources edited since: {files}"
    if t == "note":
        return str(ev.get("message", ""))
    return str(t)
