"""The workspace event log, typed: one frozen dataclass per event kind and its JSON form.

Every writer builds its events here and the fold (``records.py``) reads them back through
:func:`parse`, so an event's shape is written down once; docs/records-format.md is the
format. What the store adds to every event (``seq``, ``t``, ``epoch``, ``by``, ``ws``,
``prev``, ``mac``: see ``signing.py``) is the envelope, not part of a kind.

:func:`stop` is the one place that turns how an allocation ended into its ``stopped``
event: the stop reason from the session's exit report (:func:`exit_reason`), and the
workspace's state from the reason (``records.state_after_stop``). The supervisor, an
orphaned session, the reaper, a move and a failed launch all call it.

Fields a kind does not declare (older writers', or an extension's: policy decisions, launch
checks) travel in ``extra`` and come back out unchanged, so reading and writing an event
again never drops a field.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

ENVELOPE = ("seq", "t", "epoch", "by", "ws", "prev", "mac", "type")


@dataclass(frozen=True)
class Event:
    """An event kind: ``TYPE`` names it in the log."""

    TYPE: ClassVar[str] = ""
    extra: dict[str, Any] = field(default_factory=dict, kw_only=True)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.TYPE}
        out.update(self.extra)
        for f in fields(self):
            value = getattr(self, f.name)
            # An optional field left unset is left out, as the writers before this module did.
            if f.name != "extra" and not (value is None and f.default is None):
                out[f.name] = value
        return out

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Event:
        names = {f.name for f in fields(cls)} - {"extra"}
        known = {k: v for k, v in doc.items() if k in names}
        extra = {k: v for k, v in doc.items() if k not in names and k not in ENVELOPE}
        return cls(**known, extra=extra)


@dataclass(frozen=True)
class Other(Event):
    """A kind the fold does not act on (``policy``, ``launch-check``, ...): kept as it is."""

    kind: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"type": self.kind, **self.extra}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Event:
        return cls(kind=str(doc.get("type")), extra={k: v for k, v in doc.items() if k not in ENVELOPE})


@dataclass(frozen=True)
class Created(Event):
    TYPE: ClassVar[str] = "created"
    name: str = ""
    command: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Authority(Event):
    """Whoever won an epoch; a move's commit also carries its capsule (``extra``: move,
    capsule, from_allocation, from_spend)."""

    TYPE: ClassVar[str] = "authority"
    holder: str | None = None
    reason: str = ""
    host: str | None = None
    boot_id: str | None = None
    pid: int | None = None
    pid_start: int | None = None


@dataclass(frozen=True)
class AllocationEvent(Event):
    TYPE: ClassVar[str] = "allocation"
    allocation: dict[str, Any] = field(default_factory=dict)  # records.Allocation's fields


@dataclass(frozen=True)
class Started(Event):
    TYPE: ClassVar[str] = "started"
    allocation: str = ""
    session_pid: int | None = None
    session_pid_start: int | None = None
    python_version: str | None = None
    output: str | None = None
    python: str | None = None
    arch: str | None = None
    platform: str | None = None


@dataclass(frozen=True)
class Request(Event):
    TYPE: ClassVar[str] = "request"
    n: int | None = None
    kind: str | None = None
    requested_by: Any = None


@dataclass(frozen=True)
class Waiting(Event):
    TYPE: ClassVar[str] = "waiting"
    why: str | None = None
    seconds: float = 0.0


@dataclass(frozen=True)
class Refused(Event):
    TYPE: ClassVar[str] = "refused"
    reason: str | None = None
    message: str | None = None
    problems: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class CapsuleEvent(Event):
    """A capsule and its write check (``capsule``: records.CapsuleEntry's fields)."""

    TYPE: ClassVar[str] = "capsule"
    capsule: dict[str, Any] = field(default_factory=dict)
    distributions: dict[str, str] | None = None
    arch: str | None = None


@dataclass(frozen=True)
class Stopped(Event):
    """An allocation's end; build it with :func:`stop`."""

    TYPE: ClassVar[str] = "stopped"
    allocation: str | None = None
    reason: str = "failed"
    detail: str = ""
    exit_code: int | None = None
    state: str = "failed"
    capsule: str | None = None  # what the workspace stands on after it
    ran: bool = True
    max_rss: int | None = None
    spend: float = 0.0


@dataclass(frozen=True)
class Files(Event):
    TYPE: ClassVar[str] = "files"
    capsule: str | None = None
    source: str | None = None
    count: int | None = None
    bytes: int | None = None
    allocation: str | None = None


@dataclass(frozen=True)
class Move(Event):
    TYPE: ClassVar[str] = "move"
    move: str | None = None
    outcome: str | None = None


@dataclass(frozen=True)
class Edited(Event):
    TYPE: ClassVar[str] = "edited"
    capsule: str | None = None
    files: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class Note(Event):
    TYPE: ClassVar[str] = "note"
    message: str = ""


KINDS: dict[str, type[Event]] = {k.TYPE: k for k in (Created, Authority, AllocationEvent, Started, Request,
                                                       Waiting, Refused, CapsuleEvent, Stopped, Files, Move,
                                                       Edited, Note)}


def parse(doc: dict[str, Any]) -> Event:
    """The typed event of a log entry (its envelope left out)."""
    kind = KINDS.get(str(doc.get("type")))
    return (kind or Other).from_json(doc)


# -- how an allocation stopped ------------------------------------------------------------------


def exit_reason(code: int | None, report: dict[str, Any] | None, capsule: Any = None,
                limit: str = "") -> tuple[str, str]:
    """(stop reason, detail) from the session's end: the capsule it wrote (a
    records.CapsuleEntry after its write check), else its exit report and exit code. The
    supervisor adds what only it knows (a lost epoch, a hard stop, a session that never
    started) before asking this; an orphaned session asks this alone."""
    if capsule is not None:
        if not capsule.verified:
            return "failed", f"capsule {capsule.id} failed its write check: {capsule.error}"
        if oom_reason(capsule.reason) or code == 77:
            return "oom", f"ran out of memory{limit} at {capsule.where}"
        if capsule.reason == "preempted":
            return "preempted", f"paused at {capsule.where}"
        return "suspended", f"paused ({capsule.reason}) at {capsule.where}"
    em = report or {}
    if report is not None and not em.get("ran", True):
        return "failed", f"the program could not be carried on: {em.get('message', '')}"
    if em.get("oom"):
        said = f": {em.get('message')}" if em.get("message") else ""
        return "oom", (f"ran out of memory{limit} ({em.get('error')}{said}); the engine took no capsule at the "
                       "failing statement")
    if code == 0:
        return "finished", "exit code 0"
    if code == 76:
        return "failed", "a pause was required (SIGTERM) but could not be taken before its deadline"
    if code is not None and code < 0:
        return "failed", f"the session was killed by {signal_name(-code)}"
    if em.get("error"):
        return "failed", f"{em.get('error')}: {em.get('message', '')}"[:500]
    return "failed", f"exit code {code}"


def oom_reason(reason: str) -> bool:
    """Whether a capsule's reason says the program ran out of memory."""
    r = reason.lower()
    return "oom" in r or "memory" in r


def command_code(reason: str, code: int, capsule: Any = None) -> int:
    """The exit code of `sojourn run`/`resume` for a session that ended so: 75 paused, 76 a
    pause whose capsule failed its check, 77 out of memory, 128+n killed by signal n, else
    the program's own."""
    if capsule is not None:
        if not capsule.verified:
            return 76
        return 77 if reason == "oom" else 75
    if reason == "oom":
        return 77
    return 128 - code if code < 0 else code


def signal_name(n: int) -> str:
    import signal

    return signal.Signals(n).name if n in signal.Signals._value2member_map_ else str(n)


def stop(allocation: str | None, reason: str, detail: str = "", *, produced: str | None = None,
         standing: str | None = None, ran: bool = True, exit_code: int | None = None,
         max_rss: int | None = None, spend: float = 0.0, **extra: Any) -> Stopped:
    """The ``stopped`` event of ``allocation``. ``produced``: the verified capsule this stop
    wrote; ``standing``: what the workspace stands on otherwise (the capsule a failed resume
    started from, else the last good one). The state follows from the reason by the one
    policy, ``records.state_after_stop``."""
    from sojourn.workspace.records import state_after_stop

    standing = produced or standing
    state = state_after_stop(reason, produced if ran else standing, ran)
    return Stopped(allocation=allocation, reason=reason, detail=detail, exit_code=exit_code, state=state,
                   capsule=standing, ran=ran, max_rss=max_rss, spend=spend, extra=extra)
