"""Live moves: the source's and the destination's halves of the move protocol (docs/moves.md).

A move of workspace ``ws`` held at epoch ``e`` by allocation ``A`` to a new allocation ``B``:

1. the destination supervisor (``python -m sojourn.workspace.migrate incoming ...``) starts
   its session warm (interpreter up, sojourn imported) and says so (marker ``ready``), then
   writes the ``move`` request to the holder of epoch ``e``;
2. the source supervisor asks its session to pause with a hold: the capsule is written and
   the program stays at that statement boundary; the capsule id goes to the destination
   (marker ``source``);
3. the destination restores it (every fingerprint compared: this is the capsule's check),
   then takes epoch ``e+1`` by compare-and-swap, records the commit in one ``authority``
   event (the source's stop and the capsule's check go with it) and lets its session run;
4. the source watches the epoch: taken by ``B``, its session exits; a failure or a timeout
   first, the source takes ``e+1`` itself by the same swap and its session carries on. The
   swap serialises commit against abort: exactly one of them wins.

Markers are small objects ``move.<ws>.<move>.<part>`` (created once, exclusively) in the
repository, so the two halves need nothing but the repository to talk, on any hosts. This
module holds the protocol's objects, the verdict and the source's half; the destination's
half is ``incoming.py``.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sojourn.errors import AlreadyExists, ObjectNotFound, SojournError
from sojourn.workspace import events as E
from sojourn.workspace import records as R
from sojourn.workspace.errors import AuthorityLost
from sojourn.workspace.faults import fault, switched
from sojourn.workspace.liveness import alive, boot_id, hostname, me
from sojourn.workspace.machine import spend
from sojourn.workspace.store import KIND, WorkspaceStore, _dump, _load

if TYPE_CHECKING:
    from sojourn.workspace.supervisor import Supervisor

EXIT_MOVED = 78  # the program carries on in another allocation


def marker_name(ws: str, move: str, part: str) -> str:
    return f"move.{ws}.{move}.{part}"


def put_marker(store: WorkspaceStore, ws: str, move: str, part: str, doc: dict[str, Any]) -> bool:
    try:
        store.backend.save(KIND, marker_name(ws, move, part), _dump({**doc, "t": R.now()}), exclusive=True)
    except AlreadyExists:
        return False
    store.backend.flush()
    return True


def put_marker_until(store: WorkspaceStore, ws: str, move: str, part: str, doc: dict[str, Any]) -> None:
    """Write a marker, retrying while the repository is away: the program stays held (nothing
    else is safe) and the move settles once it answers again."""
    said = 0.0
    while True:
        try:
            put_marker(store, ws, move, part, doc)
            return
        except SojournError as e:
            if time.monotonic() - said > 10:
                said = time.monotonic()
                print(f"sojourn: move {move}: cannot write to the repository ({e}); retrying", file=sys.stderr)
            time.sleep(0.1)


def get_marker(store: WorkspaceStore, ws: str, move: str, part: str) -> dict[str, Any] | None:
    try:
        return _load(store.backend.load(KIND, marker_name(ws, move, part)), f"{part} of move {move}")
    except ObjectNotFound:
        return None


def poll_interval(store: WorkspaceStore) -> float:
    # Locally a poll is one stat (tens of microseconds): short intervals keep the pause short.
    return 0.25 if type(store.backend).__name__ == "S3Backend" else 0.004


def verify_timeout(size: int, given: float | None = None) -> float:
    """How long the source holds for the destination's restore before it takes the
    workspace back: generous, since a dead destination is noticed sooner (its pid on this
    host, its lease anywhere)."""
    return float(given) if given else 120.0 + size / 20e6


def process_gone(doc: dict[str, Any] | None) -> bool:
    """Whether the process a marker names is provably gone (only on this host)."""
    if not doc or doc.get("host") != hostname() or switched("move.source.as-remote"):
        return False
    if doc.get("boot_id") and doc.get("boot_id") != boot_id():
        return True
    return not alive(doc.get("pid"), doc.get("pid_start"))


# -- the destination's lease ----------------------------------------------------------------


def lease_seconds() -> float:
    """``L``: how long a destination's heartbeat may stand still before the source presumes it
    dead (``SOJOURN_MOVE_LEASE``, default 10 s). The destination chooses it and publishes it in
    its ``ready`` marker, so both sides use the same."""
    try:
        return max(0.4, float(os.environ.get("SOJOURN_MOVE_LEASE") or 10.0))
    except ValueError:
        return 10.0


class Heartbeat:
    """The destination's lease: it overwrites ``move.<ws>.<M>.beat`` with a counter every
    ``L/4`` s, from before its ``ready`` marker until its commit or its discard. Only the
    counter's change matters to the reader (no clock agreement between hosts is needed)."""

    def __init__(self, store: WorkspaceStore, ws: str, move: str, lease: float):
        self.store, self.ws, self.move, self.lease = store, ws, move, lease
        self.n = 0
        self.last_ok: float | None = None  # time.monotonic() of the last write that succeeded
        self._stop = threading.Event()

    def beat(self) -> None:
        self.n += 1
        doc = {"n": self.n, "lease": self.lease, "t": R.now(), **me()}
        self.store.backend.save(KIND, marker_name(self.ws, self.move, "beat"), _dump(doc))
        self.last_ok = time.monotonic()

    def start(self) -> None:
        """The first beat is written here (a repository that cannot take it fails the move
        before anything was asked), the next ones by a thread."""
        self.beat()
        threading.Thread(target=self._loop, name="sojourn-lease", daemon=True).start()

    def _loop(self) -> None:
        while not self._stop.wait(self.lease / 4):
            try:
                self.beat()
            except SojournError:
                pass  # fresh() says when it has failed for too long

    def fresh(self) -> bool:
        """Renewed within ``L/2``: past that, the source may give up on us at any moment, and
        a destination that cannot renew its lease must not commit (it discards)."""
        return self.last_ok is not None and time.monotonic() - self.last_ok <= self.lease / 2

    def stop(self) -> None:
        self._stop.set()


class LeaseWatch:
    """The source's side of the lease: the destination's heartbeat read (at most twice a
    second), and how long it has stood still by this process's own clock."""

    def __init__(self, store: WorkspaceStore, ws: str, move: str):
        self.store, self.ws, self.move = store, ws, move
        self.value: Any = None
        self.changed = time.monotonic()
        self.next_read = 0.0

    def expired(self, ready: dict[str, Any] | None) -> str | None:
        """Why the destination is presumed dead, or None. Only a destination that published
        a lease in its ``ready`` marker is judged by one."""
        lease = float((ready or {}).get("lease") or 0)
        if lease <= 0:
            return None
        now = time.monotonic()
        if now >= self.next_read:
            self.next_read = now + min(0.5, lease / 8)
            beat = get_marker(self.store, self.ws, self.move, "beat")  # raises while the repository is away
            if beat is not None and beat.get("n") != self.value:
                self.value, self.changed = beat.get("n"), time.monotonic()
                return None
        if now - self.changed <= lease:
            return None
        return (f"the destination on {where_of(ready)} stopped renewing its lease: its heartbeat "
                f"({marker_name(self.ws, self.move, 'beat')}) did not change for {lease:g} s, so it is presumed dead "
                "or cut off from the repository")


def where_of(ready: dict[str, Any] | None) -> str:
    r = ready or {}
    return f"{r.get('machine') or '?'} ({r.get('host')}, supervisor pid {r.get('pid')})"


# -- the verdict: commit or abort, settled by the epoch swap --------------------------------


@dataclass
class Verdict:
    outcome: str  # "commit" (the destination took e+1), "abort" (we did), "lost" (someone else did)
    epoch: int  # the epoch the source holds after an abort (e+1, or e if it could not write)
    why: str = ""
    doc: dict[str, Any] = field(default_factory=dict)


def _taken(store: WorkspaceStore, ws: str, epoch: int, move: str, dest: str) -> Verdict:
    n, doc = store.epoch(ws, epoch)
    doc = doc or {}
    if doc.get("holder") == dest and doc.get("move") == move:
        return Verdict("commit", n, f"moved to {dest}", doc)
    return Verdict("lost", n, f"workspace {ws} was taken by {doc.get('holder')} (epoch {n})", doc)


def await_verdict(store: WorkspaceStore, ws: str, epoch: int, al: str, move: str, dest: str, *,
                  timeout: float, capsule: dict[str, Any] | None, session_gone: Any = None) -> Verdict:
    """Hold until the destination commits (it took epoch+1) or fails; on a failure or a
    timeout, take epoch+1 for ``al`` (see :func:`abort`)."""
    t_end = time.monotonic() + timeout
    poll = poll_interval(store)
    ready: dict[str, Any] | None = None
    lease = LeaseWatch(store, ws, move)
    why = ""
    while True:
        try:
            if not store.holds(ws, epoch):
                return _taken(store, ws, epoch, move, dest)
            failed = get_marker(store, ws, move, "dest")
            if failed is not None:
                why = f"the destination refused: {failed.get('error')}"
            if ready is None:
                ready = get_marker(store, ws, move, "ready")
            if not why and process_gone(ready):
                why = f"the destination's supervisor (pid {ready.get('pid') if ready else '?'}) died"
            if not why:
                why = lease.expired(ready) or ""
        except SojournError as e:  # the repository is away: hold on, nothing may run meanwhile
            if time.monotonic() > t_end:
                why = f"the repository was unreachable ({e})"
        if not why and time.monotonic() > t_end:
            why = timeout_reason(ready, timeout)
        if why:
            return abort(store, ws, epoch, al, move, dest, why, capsule=capsule, ready=ready)
        time.sleep(poll)


def timeout_reason(ready: dict[str, Any] | None, timeout: float) -> str:
    """Why the source gave up waiting. A destination that dies is noticed sooner: at once on
    this host (its pid), within its lease elsewhere (:class:`LeaseWatch`); this timeout bounds
    a live destination's restore, and a dead one of a version without a lease."""
    if ready is None:
        return f"the destination never said it was ready within {timeout:.0f} s"
    where = where_of(ready)
    if ready.get("lease"):  # it kept its lease: alive, but its restore took longer than this
        return (f"the destination on {where} did not report a checked restore within {timeout:.0f} s, although "
                "it kept renewing its lease (`sojourn move --timeout S` gives a big capsule longer)")
    remote = "" if ready.get("host") == hostname() else (
        "; it runs on another host, so this side cannot see whether it died and waits this long before taking "
        "the workspace back (`sojourn move --timeout S` sets it)")
    return f"the destination on {where} did not report a checked restore within {timeout:.0f} s{remote}"


def abort(store: WorkspaceStore, ws: str, epoch: int, al: str, move: str, dest: str, why: str, *,
          capsule: dict[str, Any] | None, ready: dict[str, Any] | None) -> Verdict:
    """Take epoch+1 for ``al`` so that the destination can no longer commit, and record why.
    Lost to the destination: it committed first. The swap cannot be written (disk full,
    repository away): carry on at ``epoch`` without a record only when the destination is
    provably dead and epoch+1 provably free; otherwise keep the program held and retry."""
    info = {"reason": f"move {move} aborted: {why}", "move": move, **me()}
    said = 0.0
    while True:
        fault("move.abort.before-cas")
        try:
            new = store.acquire(ws, epoch, al, **info)
        except AuthorityLost:
            return _taken(store, ws, epoch, move, dest)
        except SojournError as e:
            try:
                free = store.holds(ws, epoch)
            except SojournError:
                free = False
            if free and process_gone(ready or get_marker_quiet(store, ws, move, "ready")):
                return Verdict("abort", epoch, f"{why}; the abort could not be recorded ({e})")
            if time.monotonic() - said > 10:
                said = time.monotonic()
                print(f"sojourn: move {move}: {why}; cannot record the abort ({e}); the program stays paused "
                      "until the repository answers", file=sys.stderr)
            time.sleep(0.2)
            continue
        fault("move.abort.after-cas")
        events: list[dict[str, Any]] = [{"type": "authority", "holder": al, **info}]
        if capsule is not None:
            events.append({"type": "capsule", "move": move,
                           "capsule": capsule_entry(capsule, al, False, f"move {move} aborted: {why}")})
        events.append({"type": "move", "move": move, "outcome": "aborted", "source": al, "destination": dest,
                       "reason": why, "capsule": capsule.get("capsule") if capsule else None})
        try:
            store.append(ws, new, al, *events)
        except SojournError as e:
            print(f"sojourn: move {move} aborted ({why}) but could not be recorded: {e}", file=sys.stderr)
        return Verdict("abort", new, why)


def get_marker_quiet(store: WorkspaceStore, ws: str, move: str, part: str) -> dict[str, Any] | None:
    try:
        return get_marker(store, ws, move, part)
    except SojournError:
        return None


def capsule_entry(msg: dict[str, Any], al: str, verified: bool, error: str | None = None) -> dict[str, Any]:
    return R.CapsuleEntry(id=str(msg["capsule"]), parent=msg.get("parent"), reason=str(msg.get("reason", "move")),
                          where=str(msg.get("where", "")), size=int(msg.get("size", 0)), time=R.now(),
                          allocation=al, verified=verified, error=error).__dict__


def moved_events(al: str, msg: dict[str, Any], verdict: Verdict, move: str, *, exit_code: int | None = None,
                 max_rss: int | None = None, log_bytes: int | None = None, spend: float = 0.0) -> list[dict[str, Any]]:
    """What the source records once the destination won: its capsule (checked by the
    destination's restore, which came before the swap) and its stop. Void when the
    destination's ``authority`` event, which says the same, is already in the log."""
    dest = str(verdict.doc.get("holder"))
    return [{"type": "capsule", "move": move, "capsule": capsule_entry(msg, al, True), "verified_by": dest},
            E.stop(al, "moved", f"moved to {dest} (move {move}, epoch {verdict.epoch})", produced=str(msg["capsule"]),
                   exit_code=exit_code, max_rss=max_rss, spend=spend, log_bytes=log_bytes).to_json()]


# -- the source: a move request served by the supervisor ----------------------------------


def serve_move(sup: Supervisor, req: dict[str, Any]) -> None:
    """Run the source's half in the supervisor's watcher thread (so nothing else of the
    watcher, such as its authority check, runs meanwhile)."""
    s, store = sup.spec, sup.store
    ws, epoch, al = s.workspace, s.epoch, s.allocation
    move, dest = str(req.get("move")), str(req.get("allocation"))
    sup.moving = move
    try:
        fault("move.source.after-request")
        while not sup.inbox.empty():
            sup.inbox.get_nowait()
        deadline = float(req.get("deadline") or 600.0)
        sup._control({"op": "pause", "reason": "move", "deadline": deadline, "action": "continue",
                      "on_timeout": "continue", "hold": move, "timeout": req.get("timeout")})
        msg = _wait_capsule(sup, move, deadline + 30.0)
        if isinstance(msg, str):
            put_marker_until(store, ws, move, "source", {"error": msg})
            sup.append({"type": "move", "move": move, "outcome": "refused", "source": al, "destination": dest,
                        "reason": msg})
            return
        fault("move.source.after-capsule")
        put_marker_until(store, ws, move, "source", source_doc(msg))
        fault("move.source.after-marker")
        v = await_verdict(store, ws, epoch, al, move, dest, timeout=verify_timeout(int(msg.get("size", 0)),
                                                                                   req.get("timeout")),
                          capsule=None if sup._done.is_set() else msg)
        if v.outcome == "commit":
            fault("move.source.after-commit-seen")
            sup.moved = (msg, v, move)
            sup._control({"op": "verdict", "move": move, "go": "exit"})
        elif v.outcome == "lost":
            sup._lose_authority()
        else:
            fault("move.source.after-abort")
            s.epoch = v.epoch
            if sup._done.is_set():  # the session died while held: its capsule is the state now
                sup.capsule_msg = {**msg, "action": "exit"}
            # The session says so on its stderr (in the workspace's log): "move ... aborted".
            sup._control({"op": "verdict", "move": move, "go": "continue", "epoch": v.epoch, "why": v.why})
    finally:
        sup.moving = None


def finish_moved(sup: Supervisor, rc: int, max_rss: int) -> Any:
    """The source's end after a commit (its session exited at the destination's win)."""
    from sojourn.workspace.supervisor import Outcome

    msg, verdict, move = sup.moved
    s = sup.spec
    fault("move.source.before-record")
    if sup.lost_authority is None:
        try:
            sup.append(*moved_events(s.allocation, msg, verdict, move, exit_code=rc, max_rss=max_rss,
                                     log_bytes=sup.log.bytes_written,
                                     spend=spend(s.price_per_hour, time.time() - sup.t0)))
            sup.store.record(s.workspace)
        except SojournError as e:
            print(f"sojourn: the move's source could not record its stop: {e}", file=sys.stderr)
    dest = verdict.doc.get("holder")
    return Outcome("moved", "running", EXIT_MOVED, None, f"moved to {dest} (epoch {verdict.epoch}) by move {move}",
                   ran=True, max_rss=max_rss)


def source_doc(msg: dict[str, Any]) -> dict[str, Any]:
    return {k: msg.get(k) for k in ("capsule", "parent", "where", "size", "paused_wall", "reason", "seconds_capture")}


def _wait_capsule(sup: Supervisor, move: str, timeout: float) -> dict[str, Any] | str:
    t_end = time.monotonic() + timeout
    ended: float | None = None
    while True:
        try:
            m = sup.inbox.get(timeout=0.02)
        except queue.Empty:
            m = None
        if m is not None:
            if m.get("event") == "capsule" and m.get("move") == move:
                return m
            if m.get("event") == "refusal":
                return f"the pause was refused; the program keeps running: {m.get('message')}"
        elif sup._done.is_set():
            # The session may have reported its capsule and died at once: the pump thread
            # still drains its status pipe (EOF comes right after), so give it a moment.
            ended = ended or time.monotonic()
            if time.monotonic() - ended > 1.0:
                return "the session ended before it could pause"
        if time.monotonic() > t_end:
            return f"the program did not reach a statement where it can pause within {timeout:.0f} s"
        if sup.log.due():
            sup.log.flush()


def decide_alone(repo_url: str, ws: str, epoch: int, al: str, move: str, msg: dict[str, Any],
                 timeout: float | None) -> None:
    """The session held for a move lost its supervisor: settle the move itself, record the
    outcome, and return (the caller then exits: with no supervisor it does not run on)."""
    from sojourn.repository.repo import open_repository
    from sojourn.workspace.orphan import record_orphan_pause

    with open_repository(repo_url) as repo:
        store = WorkspaceStore(repo)
        dest = str((get_marker_quiet(store, ws, move, "ready") or {}).get("allocation", ""))
        # The supervisor may have died before it told the destination: the capsule is here.
        put_marker_until(store, ws, move, "source", source_doc(msg))
        v = await_verdict(store, ws, epoch, al, move, dest, timeout=verify_timeout(int(msg.get("size", 0)), timeout),
                          capsule=None)
        if v.outcome == "commit":
            from sojourn.workspace.orphan import log_the_rest

            log_the_rest(repo, ws, al)  # the source's output its supervisor had not logged
            store.append(ws, epoch, al, *moved_events(al, msg, v, move))
            return
        if v.outcome == "lost" and v.doc.get("holder") == al:  # our supervisor aborted, then died
            v = Verdict("abort", v.epoch, v.why, v.doc)
    if v.outcome == "abort":
        record_orphan_pause(repo_url, ws, al, v.epoch, {**msg, "action": "exit"})


if __name__ == "__main__":  # the destination's entry point moved to incoming.py; this name still works
    from sojourn.workspace.incoming import main

    sys.exit(main())
