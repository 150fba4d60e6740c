"""Workspace objects in the repository: the only place a workspace's state lives.

Objects (kind ``workspaces`` unless noted; every name starts with its type, so a listing by
prefix returns one type only, which S3 answers server-side):

==================================  ===========================================================
``meta.<ws>``                       immutable: id, name, creation time, command (exclusive)
``name.<name>``                     the name's owner, claimed by exclusive create
``event.<ws>.<seq:08d>``            the append-only event log; created exclusively, so two
                                    writers never share a number and the log has no holes
``summary.<ws>``                    a cache: the fold of events 1..upto (overwritten freely)
``request.<ws>.<epoch>.<n:04d>``    a pause request for the holder of ``epoch``
``log.<ws>.<al>.<seq:06d>``         the program's output, in pieces, per allocation (logs.py)
locks/``epoch.<ws>.<n:06d>``        authority: created exclusively, so one writer wins epoch n
==================================  ===========================================================

The summary is never trusted blindly: a reader checks its MAC, that the event after ``upto``
does not exist (one ``stat``) and that event ``upto`` does (a log cut at its end), and folds
the newer events in when it does.

Meta, events and summaries are authenticated with the repository key (``signing.py``,
docs/records-format.md): every event is read through :meth:`WorkspaceStore.events`, which
checks its MAC, workspace, number and chain link before anyone sees it.
"""

from __future__ import annotations

import copy
import hmac
import json
import os
import re
import sys
import threading
from collections.abc import Iterable
from typing import Any

from sojourn.errors import AlreadyExists, ObjectNotFound, RepositoryError
from sojourn.repository.repo import Repository, pin
from sojourn.threads import Executor
from sojourn.workspace import records as R
from sojourn.workspace.errors import AuthorityLost, WorkspaceError, WorkspaceNotFound
from sojourn.workspace.events import Event
from sojourn.workspace.signing import (
    EVENT_DOMAIN,
    LOCK_DOMAIN,
    META_DOMAIN,
    REQUEST_DOMAIN,
    SUMMARY_DOMAIN,
    RecordKey,
    RecordTampered,
    check_event,
    check_meta,
    link_of,
)

KIND = "workspaces"
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def _dump(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()


def _load(raw: bytes, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise WorkspaceError(f"{what} is not valid JSON ({e}); the repository is damaged") from e
    if not isinstance(doc, dict):
        raise WorkspaceError(f"{what} is not a JSON object; the repository is damaged")
    return doc


def event_name(ws: str, seq: int) -> str:
    return f"event.{ws}.{seq:08d}"


def epoch_name(ws: str, epoch: int) -> str:
    return f"epoch.{ws}.{epoch:06d}"


def request_name(ws: str, epoch: int, n: int) -> str:
    return f"request.{ws}.{epoch}.{n:04d}"


def check_workspace_name(name: str) -> None:
    if not NAME_RE.match(name) or name.startswith("ws_"):
        raise WorkspaceError(
            f"invalid workspace name {name!r}: use 1-64 letters, digits, '.', '_' or '-', starting "
            "with a letter or digit (and not 'ws_', which ids use)"
        )


class WorkspaceStore:
    """Reads and writes workspace objects. Safe to share between threads; every cross-process
    race is settled by the backend's exclusive create."""

    def __init__(self, repo: Repository):
        # A process that works in a workspace works in this repository and no other one that
        # may appear at its URL (repo.pin): its sessions never create a repository.
        pin(repo)
        self.repo = repo
        self.backend = repo.backend
        self.key = RecordKey(repo.key, repo.id)
        self._lock = threading.Lock()
        # Per workspace: (last sequence number, its chain link, whether a signed record came).
        self._heads: dict[str, tuple[int, str, bool]] = {}
        self._links: dict[tuple[str, int], tuple[str, bool]] = {}  # checked events: link, signed so far
        self._metas: dict[str, tuple[dict[str, Any], bool]] = {}  # meta objects are immutable
        self._records: dict[str, R.WorkspaceRecord] = {}  # the last fold, per workspace (record())
        self._planted: set[tuple[str, int]] = set()  # planted epochs already reported

    # -- creation and names ----------------------------------------------------------------

    def create(self, command: R.Command, name: str | None = None, *, default_name: str = "job",
               creator: dict[str, Any] | None = None) -> dict[str, Any]:
        """Create a workspace (its ``meta`` object and its name) and return the meta.
        ``creator`` (host, boot id, pid) lets a reader tell a creator that died before it
        took the workspace's first epoch."""
        ws = R.new_id("ws")
        if name is not None:
            check_workspace_name(name)
            self._claim(name, ws)
        else:
            name = self._claim_free(default_name, ws)
        meta = self.key.sign(META_DOMAIN, {"format": R.RECORD_FORMAT, "id": ws, "name": name, "created": R.now(),
                                           "command": command.__dict__, "creator": creator})
        self.backend.save(KIND, f"meta.{ws}", _dump(meta), exclusive=True)
        return meta

    def _claim(self, name: str, ws: str) -> None:
        try:
            self.backend.save(KIND, f"name.{name}", _dump({"id": ws}), exclusive=True)
        except AlreadyExists:
            owner = self.name_owner(name)
            raise WorkspaceError(f"the name {name!r} is taken by workspace {owner}; choose another "
                                 "name (--name)") from None

    def _claim_free(self, base: str, ws: str) -> str:
        stem = re.sub(r"[^A-Za-z0-9._-]", "-", base).strip(".-_")[:48] or "job"
        if stem.startswith("ws_"):
            stem = "job-" + stem
        for i in range(1, 10_000):
            candidate = stem if i == 1 else f"{stem}-{i}"
            try:
                self.backend.save(KIND, f"name.{candidate}", _dump({"id": ws}), exclusive=True)
                return candidate
            except AlreadyExists:
                continue
        raise WorkspaceError(f"no free workspace name starting with {stem!r}; pass --name")

    def name_owner(self, name: str) -> str | None:
        try:
            return str(_load(self.backend.load(KIND, f"name.{name}"), f"name {name}")["id"])
        except (ObjectNotFound, KeyError):
            return None

    def resolve(self, ref: str) -> str:
        """A workspace id from an id, a unique id prefix (with or without ``ws_``), or a name."""
        ref = ref.strip()
        if not ref or "/" in ref or ref.startswith("."):
            raise WorkspaceNotFound(f"no workspace {ref!r} in {self.repo.url}")
        if ref.startswith("ws_") and self.backend.stat(KIND, f"meta.{ref}") is not None:
            return ref
        if NAME_RE.match(ref) and not ref.startswith("ws_"):
            owner = self.name_owner(ref)
            if owner is not None:
                return owner
        prefix = ref if ref.startswith("ws_") else "ws_" + ref
        matches = [n[len("meta."):] for n in self.backend.list(KIND, f"meta.{prefix}")]
        if len(matches) == 1:
            return matches[0]
        if matches:
            raise WorkspaceNotFound(f"{ref!r} is ambiguous in {self.repo.url}: {', '.join(matches[:5])}")
        raise WorkspaceNotFound(f"no workspace {ref!r} in {self.repo.url} (`sojourn ps` lists them)")

    def meta(self, ws: str) -> dict[str, Any]:
        """The workspace's checked meta object (signed, or a format-1 one: see :meth:`meta_signed`)."""
        return self._meta(ws)[0]

    def meta_signed(self, ws: str) -> bool:
        return self._meta(ws)[1]

    def _meta(self, ws: str) -> tuple[dict[str, Any], bool]:
        known = self._metas.get(ws)
        if known is not None:
            return known
        try:
            doc = _load(self.backend.load(KIND, f"meta.{ws}"), f"meta of {ws}")
        except ObjectNotFound:
            raise WorkspaceNotFound(f"no workspace {ws} in {self.repo.url}") from None
        signed = check_meta(self.key, ws, doc)
        self._metas[ws] = (doc, signed)
        return doc, signed

    def ids(self) -> list[str]:
        return [n[len("meta."):] for n in self.backend.list(KIND, "meta.")]

    # -- events ----------------------------------------------------------------------------

    def append(self, ws: str, epoch: int, by: str, *events: dict[str, Any] | Event) -> list[int]:
        """Append events fenced by ``epoch`` (an event of a stale epoch is kept but void).

        Safe under concurrent writers: each event is an exclusive create of the next free
        sequence number; a writer that loses a number checks the winner's event and chains
        onto it. Each event is signed, names ``ws``, its number and the link of the one before."""
        seqs: list[int] = []
        with self._lock:
            head = self._heads.get(ws)
            if head is None:
                head = self._probe_head(ws)
            seq, link, signed = head
            try:
                # A directory swapped for another repository takes writes without an error:
                # an event written there is lost once the real one is back, and the log has
                # a hole that refuses the whole record. So look before every append.
                self.repo.check_identity()
                self._append(ws, epoch, by, events, seqs, [seq, link, signed])
            except RepositoryError as e:
                # What was written stays written: say how much, so that a caller that keeps
                # the rest for later (the supervisor during an outage) never writes one twice.
                e.appended = len(seqs)  # type: ignore[attr-defined]
                raise
        self.backend.flush()
        return seqs

    def _append(self, ws: str, epoch: int, by: str, events: tuple[dict[str, Any] | Event, ...], seqs: list[int],
                state: list[Any]) -> None:
        seq, link, signed = state
        try:
            for ev in events:
                body = ev.to_json() if isinstance(ev, Event) else dict(ev)
                while True:
                    seq += 1
                    doc = dict(body)
                    doc.update(seq=seq, epoch=epoch, by=by, ws=ws, prev=link)
                    doc.setdefault("t", R.now())
                    doc = self.key.sign(EVENT_DOMAIN, doc)
                    try:
                        self.backend.save(KIND, event_name(ws, seq), _dump(doc), exclusive=True)
                        link, signed = doc["mac"], True
                        break
                    except AlreadyExists:
                        other = self._load_event(ws, seq)
                        if other is None:  # removed under us: the reader will say so
                            raise RecordTampered(f"event {seq} of workspace {ws} vanished while it was being "
                                                 "appended after; nothing was written") from None
                        signed = check_event(self.key, ws, seq, other, link, signed) or signed
                        link = link_of(other)
                        self._links[(ws, seq)] = (link, signed)
                seqs.append(seq)
                self._links[(ws, seq)] = (link, signed)
        finally:
            if seqs:
                self._heads[ws] = (seqs[-1], *self._links[(ws, seqs[-1])])

    def _anchor(self, ws: str, seq: int) -> tuple[str, bool]:
        """The chain link of record ``seq`` (0: the meta) and whether a signed record came by then."""
        if seq == 0:
            meta, signed = self._meta(ws)
            return link_of(meta), signed
        known = self._links.get((ws, seq))
        if known is not None:
            return known
        doc = self._load_event(ws, seq)
        if doc is None:
            raise RecordTampered(f"event {seq} of workspace {ws} is missing while later ones are read: the log "
                                 "was cut. Nothing was run; restore the missing object from a backup")
        # Checked on its own (MAC, workspace, number); its own link back was checked by
        # whoever read it in order, and only one genuine event can have this number.
        _, signed_meta = self._meta(ws)
        signed = check_event(self.key, ws, seq, doc, str(doc.get("prev", "")), signed_meta) or signed_meta
        return link_of(doc), signed

    def event(self, ws: str, seq: int) -> dict[str, Any] | None:
        """Event ``seq`` on its own, checked (MAC, workspace, number), or None when absent."""
        doc = self._load_event(ws, seq)
        if doc is not None:
            _, signed_meta = self._meta(ws)
            check_event(self.key, ws, seq, doc, str(doc.get("prev", "")), signed_meta)
        return doc

    def _load_event(self, ws: str, seq: int) -> dict[str, Any] | None:
        try:
            raw = self.backend.load(KIND, event_name(ws, seq))
        except ObjectNotFound:
            return None
        return _load(raw, f"event {seq} of {ws}")

    def _probe_head(self, ws: str) -> tuple[int, str, bool]:
        summary = self._summary(ws)
        if summary is not None:
            seq, link, signed = int(summary["upto"]), str(summary["head"]), bool(summary["record"].get("signed"))
        else:
            seq = 0
            link, signed = self._anchor(ws, 0)
        new, link, signed = self._read(ws, seq + 1, link, signed)
        return seq + len(new), link, signed

    def events(self, ws: str, start: int = 1) -> list[dict[str, Any]]:
        """Checked events ``start``, ``start+1``... up to the last one (none of a workspace
        whose meta is not written yet, or gone; events without their meta are refused)."""
        try:
            link, signed = self._anchor(ws, start - 1)
        except WorkspaceNotFound:
            if self.backend.stat(KIND, event_name(ws, start)) is None:
                return []
            raise
        return self._read(ws, start, link, signed)[0]

    def _read(self, ws: str, start: int, link: str, signed: bool) -> tuple[list[dict[str, Any]], str, bool]:
        """Events from ``start`` on, each checked against the link of the one before; refuses a
        forged, replayed, reordered or cut log (:class:`RecordTampered`)."""
        out: list[dict[str, Any]] = []
        seq = start
        while True:
            doc = self._load_event(ws, seq)
            if doc is None:
                # A writer creates event k only after it saw k-1, so a later event behind a
                # missing one means someone removed it (once k+1 is seen, k is there unless
                # removed: a writer may just have created both since the first load).
                if self.backend.stat(KIND, event_name(ws, seq + 1)) is None:
                    return out, link, signed
                doc = self._load_event(ws, seq)
                if doc is None:
                    raise RecordTampered(
                        f"event {seq} of workspace {ws} is missing while event {seq + 1} is there: the log was cut "
                        "in the middle. Nothing was run; restore the missing object from a backup")
            signed = check_event(self.key, ws, seq, doc, link, signed) or signed
            link = link_of(doc)
            self._links[(ws, seq)] = (link, signed)
            out.append(doc)
            seq += 1

    # -- the record ------------------------------------------------------------------------

    def _summary(self, ws: str) -> dict[str, Any] | None:
        """The summary when it is this format's, signed, and this workspace's; else None (a
        summary is a cache: one that is not trusted only costs a longer fold). Its object is
        the MAC's hex digits, a newline and the JSON it covers, so that the check is one HMAC
        over the bytes read (``ps`` reads one summary per workspace)."""
        try:
            raw = self.backend.load(KIND, f"summary.{ws}")
        except ObjectNotFound:
            return None
        mac, _, body = bytes(raw).partition(b"\n")
        if not hmac.compare_digest(mac, self.key.mac_bytes(SUMMARY_DOMAIN, body).encode()):
            return None
        doc = _load(body, f"summary of {ws}")
        if doc.get("format") != R.RECORD_FORMAT or doc.get("ws") != ws:
            return None
        if not isinstance(doc.get("record"), dict) or not isinstance(doc.get("head"), str):
            return None
        return doc

    def _from_summary(self, summary: dict[str, Any], *, check_tail: bool = True) -> R.WorkspaceRecord:
        rec = R.WorkspaceRecord.from_json(summary["record"])
        rec.head = str(summary["head"])
        upto = int(summary["upto"])
        # The summary is signed and says event ``upto`` existed: if it is gone, the newest
        # events were removed (a rollback), which the log alone could not show. (A listing
        # skips this stat: it shows, and every command that acts reads the full record.)
        if check_tail and upto > 0 and self.backend.stat(KIND, event_name(rec.id, upto)) is None:
            raise RecordTampered(
                f"workspace {rec.id}'s signed summary covers events 1..{upto}, but event {upto} is gone: the newest "
                "events were removed (a rollback). Nothing was run; restore them from a backup")
        self._links.setdefault((rec.id, upto), (rec.head, rec.signed))
        return rec

    def _initial(self, ws: str) -> R.WorkspaceRecord:
        return R.initial(self._meta(ws)[0])

    def record(self, ws: str, *, save: bool = True) -> R.WorkspaceRecord:
        """The workspace's record: its summary with every newer event folded in (each checked).

        The last record this store folded is kept, so that a command that reads the record
        again (a resume reads it at each step) folds only the events that came since: each
        event is read, checked and folded once per process."""
        known = self._records.get(ws)
        if known is not None:
            rec = copy.deepcopy(known)
        else:
            summary = self._summary(ws)
            rec = self._from_summary(summary) if summary else self._initial(ws)
        rec = self._advance(rec, save=save)
        self._records[ws] = copy.deepcopy(rec)
        return rec

    def _advance(self, rec: R.WorkspaceRecord, *, save: bool) -> R.WorkspaceRecord:
        new, _, _ = self._read(rec.id, rec.upto + 1, rec.head, rec.signed)
        for ev in new:
            R.apply(rec, ev)
            rec.head = link_of(ev)
            if "mac" in ev:
                rec.signed = True
            else:
                rec.unsigned += 1
        if new and save:
            self.save_summary(rec)
        return rec

    def save_summary(self, rec: R.WorkspaceRecord) -> None:
        body = _dump({"format": R.RECORD_FORMAT, "ws": rec.id, "upto": rec.upto, "head": rec.head,
                      "record": rec.to_json()})
        try:
            self.backend.save(KIND, f"summary.{rec.id}", self.key.mac_bytes(SUMMARY_DOMAIN, body).encode() + b"\n" + body)
        except RepositoryError:
            pass  # a cache that cannot be written (a read-only repository) only costs time

    def summary_record(self, ws: str) -> R.WorkspaceRecord:
        """The record for a listing: the summary if no event came after it (one stat), else
        the summary with the newer events folded in."""
        summary = self._summary(ws)
        if summary is None:
            return self.record(ws)
        rec = self._from_summary(summary, check_tail=False)
        if self.backend.stat(KIND, event_name(ws, rec.upto + 1)) is None:
            return rec
        return self._advance(rec, save=True)

    def records(self, ids: Iterable[str] | None = None) -> list[R.WorkspaceRecord]:
        """Every workspace's record, read in parallel on object stores."""
        wanted = list(ids) if ids is not None else self.ids()
        local = type(self.backend).__name__ in ("LocalBackend", "MemoryBackend")
        if local or len(wanted) < 8:
            out = [self._safe_summary(ws) for ws in wanted]
        else:
            with Executor(32, thread_name_prefix="sojourn-ps") as pool:
                out = list(pool.map(self._safe_summary, wanted))
        return [r for r in out if r is not None]

    def _safe_summary(self, ws: str) -> R.WorkspaceRecord | None:
        try:
            return self.summary_record(ws)
        except WorkspaceNotFound:
            return None  # removed while we listed

    # -- authority -------------------------------------------------------------------------

    def epoch(self, ws: str, hint: int = 0) -> tuple[int, dict[str, Any] | None]:
        """The current epoch (the highest genuine ``epoch.<ws>.<n>`` object) and its content."""
        n, doc = hint, None
        while True:
            try:
                raw = self.backend.load("locks", epoch_name(ws, n + 1))
            except ObjectNotFound:
                break
            nxt = _load(raw, f"epoch {n + 1} of {ws}")
            if not self._genuine(ws, n + 1, nxt, LOCK_DOMAIN, "epoch"):
                break  # planted: it takes nothing (acquire says so)
            n, doc = n + 1, nxt
        if doc is None and n > 0:
            doc = _load(self.backend.load("locks", epoch_name(ws, n)), f"epoch {n} of {ws}")
        return n, doc

    def _genuine(self, ws: str, n: int, doc: dict[str, Any], domain: bytes, field: str) -> bool:
        """Whether a lock or request object was written with the repository key for ``ws``
        and number ``n``; an unsigned one counts only in a workspace whose log is unsigned
        (records format 1, written before these were signed)."""
        if "mac" in doc:
            return self.key.valid(domain, doc) and doc.get("workspace") == ws and doc.get(field) == n
        try:
            return not self.meta_signed(ws)
        except WorkspaceError:
            return True  # no readable meta: nothing to tell a planted object by; as before

    def acquire(self, ws: str, expected: int, holder: str, **info: Any) -> int:
        """Compare-and-swap the authority from epoch ``expected`` to ``expected + 1`` held by
        ``holder``. Exactly one of any number of concurrent callers wins; the others get
        :class:`AuthorityLost` naming the winner. The epoch object is signed: one planted
        without the key takes nothing, and is refused here with what to remove."""
        new = expected + 1
        doc = self.key.sign(LOCK_DOMAIN, {"workspace": ws, "epoch": new, "holder": holder, "t": R.now(), **info})
        try:
            self.backend.save("locks", epoch_name(ws, new), _dump(doc), exclusive=True)
        except AlreadyExists:
            try:
                won = _load(self.backend.load("locks", epoch_name(ws, new)), f"epoch {new} of {ws}")
            except ObjectNotFound:
                won = None
            if won is not None and not self._genuine(ws, new, won, LOCK_DOMAIN, "epoch"):
                raise RecordTampered(
                    f"locks/{epoch_name(ws, new)} in {self.repo.url} was not written with the repository key "
                    "(planted by someone who can write the repository); nothing was run. Remove that object "
                    "and try again") from None
            current, won = self.epoch(ws, expected)
            who = (won or {}).get("holder")
            raise AuthorityLost(f"workspace {ws} was taken by {who} (epoch {current}) while this "
                                f"command held epoch {expected}", current, who) from None
        self.backend.flush()
        return new

    def holds(self, ws: str, epoch: int) -> bool:
        """Whether ``epoch`` is still the current one (no one created the next, with the key)."""
        if self.backend.stat("locks", epoch_name(ws, epoch + 1)) is None:
            return True
        try:
            nxt = _load(self.backend.load("locks", epoch_name(ws, epoch + 1)), f"epoch {epoch + 1} of {ws}")
        except ObjectNotFound:
            return True
        if self._genuine(ws, epoch + 1, nxt, LOCK_DOMAIN, "epoch"):
            return False
        if (ws, epoch + 1) not in self._planted:
            self._planted.add((ws, epoch + 1))
            print(f"sojourn: ignored locks/{epoch_name(ws, epoch + 1)}: not written with the repository key "
                  "(planted); the program keeps running. Remove that object", file=sys.stderr)
        return True

    # -- pause requests --------------------------------------------------------------------

    def request(self, ws: str, epoch: int, kind: str, **data: Any) -> int:
        doc = {"kind": kind, "t": R.now(), "host": os.uname().nodename, "pid": os.getpid(), **data}
        n = 1
        while True:
            try:
                signed = self.key.sign(REQUEST_DOMAIN, {**doc, "n": n, "workspace": ws, "epoch": epoch})
                self.backend.save(KIND, request_name(ws, epoch, n), _dump(signed), exclusive=True)
                self.backend.flush()
                return n
            except AlreadyExists:
                n += 1

    def poll_request(self, ws: str, epoch: int, n: int) -> dict[str, Any] | None:
        """Request ``n``; one written without the repository key comes back as
        ``{"kind": "planted"}``, to be skipped (it pauses or moves nothing)."""
        try:
            doc = _load(self.backend.load(KIND, request_name(ws, epoch, n)), f"request {n} of {ws}")
        except ObjectNotFound:
            return None
        if "mac" in doc:
            ok = self.key.valid(REQUEST_DOMAIN, doc) and doc.get("workspace") == ws and doc.get("n") == n \
                and doc.get("epoch") == epoch
        else:
            ok = self._genuine(ws, n, doc, REQUEST_DOMAIN, "n")
        return doc if ok else {"kind": "planted", "n": n}
