"""Workspace records authenticated with the repository key (records format 2).

The event log decides what runs: which capsule ``sojourn resume`` carries on from and which
interpreter it starts. Anyone who can write the repository's objects can append to it, so
every record sojourn writes carries an HMAC-SHA256 under a subkey of the repository key
(HKDF-SHA256, salt ``"sojourn repository " + id``, info ``"sojourn record authentication
v1"``), over its canonical JSON, which names its workspace and sequence number and the MAC
of the event before it (``prev``; the first event's ``prev`` is the meta's MAC). So:

* a forged event (no key) fails its MAC;
* an event copied from another workspace or to another number names the wrong ``ws`` or
  ``seq``;
* reordered events, or a log with an event removed from its middle, break the chain;
* a summary (the fold's cache) is signed the same way and names the MAC of its last event.

Format-1 records (sojourn before this) carry no MAC. They are still read, flagged as
unsigned (:attr:`~sojourn.workspace.records.WorkspaceRecord.unsigned`), and nothing they
say is trusted to run: see docs/records-format.md. Once a workspace has a signed record,
an unsigned one after it is refused (no downgrade within a log).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

from sojourn.repository.crypto import hkdf
from sojourn.workspace.errors import WorkspaceError

EVENT_DOMAIN = b"sojourn.event.v2\0"
META_DOMAIN = b"sojourn.meta.v2\0"
SUMMARY_DOMAIN = b"sojourn.summary.v2\0"
CONFIG_DOMAIN = b"sojourn.config.v1\0"
# The authority (locks/epoch.*) and pause requests: a planted epoch would make a running
# supervisor kill its program as taken over; a planted request would pause or move it.
LOCK_DOMAIN = b"sojourn.lock.v1\0"
REQUEST_DOMAIN = b"sojourn.request.v1\0"
SIGNATURE_LINE = "# sojourn-signature: v1 "


class RecordTampered(WorkspaceError):
    """A workspace record failed its authentication: forged, altered, moved, reordered or cut."""


def canonical(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, separators=(",", ":"), sort_keys=True, ensure_ascii=False).encode()


class RecordKey:
    """The records' MAC key of one repository (bound to its id through the HKDF salt)."""

    def __init__(self, master: bytes, repo_id: str):
        self.repo_id = repo_id
        self._key = hkdf(master, b"sojourn repository " + repo_id.encode(), b"sojourn record authentication v1")

    def mac(self, domain: bytes, doc: dict[str, Any]) -> str:
        body = {k: v for k, v in doc.items() if k != "mac"}
        return hmac.new(self._key, domain + canonical(body), hashlib.sha256).hexdigest()

    def sign(self, domain: bytes, doc: dict[str, Any]) -> dict[str, Any]:
        out = dict(doc)
        out["mac"] = self.mac(domain, out)
        return out

    def valid(self, domain: bytes, doc: dict[str, Any]) -> bool:
        mac = doc.get("mac")
        return isinstance(mac, str) and hmac.compare_digest(mac, self.mac(domain, doc))

    def mac_bytes(self, domain: bytes, data: bytes) -> str:
        return hmac.new(self._key, domain + data, hashlib.sha256).hexdigest()


def link_of(doc: dict[str, Any]) -> str:
    """What the next event's ``prev`` names: a signed record's MAC; for an unsigned (format-1)
    one, the hash of its canonical JSON (binds a signed suffix to the exact record before it)."""
    mac = doc.get("mac")
    if isinstance(mac, str):
        return mac
    return "sha256:" + hashlib.sha256(canonical(doc)).hexdigest()


def check_meta(key: RecordKey, ws: str, meta: dict[str, Any]) -> bool:
    """Whether the meta is signed (True) or a format-1 one (False); refuse anything else."""
    if meta.get("id") != ws:
        raise RecordTampered(f"the meta object of workspace {ws} names {str(meta.get('id'))[:40]!r}: it was copied "
                             "from another workspace. Nothing of it was used")
    if "mac" not in meta:
        if meta.get("format", 1) != 1:
            raise RecordTampered(f"the meta of workspace {ws} says records format {meta.get('format')} but carries "
                                 "no MAC: it was altered. Nothing of it was used")
        return False
    if not key.valid(META_DOMAIN, meta):
        raise RecordTampered(f"the meta of workspace {ws} fails its MAC under the key of {key.repo_id}: it was "
                             "altered (or written with another repository's key). Nothing of it was used")
    return True


def check_event(key: RecordKey, ws: str, seq: int, doc: dict[str, Any], prev: str, signed_before: bool) -> bool:
    """Check event ``seq`` of ``ws`` whose predecessor links as ``prev``; True when signed.
    ``signed_before``: the meta or an earlier event was signed, so this one must be too."""
    where = f"event {seq} of workspace {ws}"
    if "mac" not in doc:
        if signed_before:
            raise RecordTampered(
                f"{where} carries no MAC although the records before it are signed: it was planted by someone "
                "without the repository key. Nothing was run; remove the object "
                f"workspaces/event.{ws}.{seq:08d} (and any after it) to go on from the log before it")
        if int(doc.get("seq", -1)) != seq:
            raise RecordTampered(f"{where} (unsigned, records format 1) says it is event {doc.get('seq')}: the log "
                                 "was reordered. Nothing was run")
        return False
    if not key.valid(EVENT_DOMAIN, doc):
        raise RecordTampered(
            f"{where} fails its MAC under the key of {key.repo_id}: it was forged or altered by someone without the "
            "repository key. Nothing was run; restore the object from a backup or remove it and every event after it")
    if doc.get("ws") != ws or int(doc.get("seq", -1)) != seq:
        raise RecordTampered(
            f"{where} is event {doc.get('seq')} of workspace {doc.get('ws')}: a genuine event replayed under another "
            "name. Nothing was run")
    if doc.get("prev") != prev:
        raise RecordTampered(
            f"{where} does not follow the event before it (its chain link differs): the log was reordered or an "
            "event was replaced. Nothing was run")
    return True


def sign_config(key: RecordKey, name: str, text: str) -> str:
    """``text`` with a last line that authenticates it as ``config/<name>`` of this repository."""
    body = text if text.endswith("\n") else text + "\n"
    mac = key.mac_bytes(CONFIG_DOMAIN + name.encode() + b"\0", body.encode())
    return body + f"{SIGNATURE_LINE}{mac}\n"


def config_signed(key: RecordKey, name: str, text: str) -> bool:
    """Whether ``text`` ends with a valid signature line for ``config/<name>``."""
    body, sep, last = text.rstrip("\n").rpartition("\n")
    if not sep:
        body, last = "", text.rstrip("\n")
    prefix = SIGNATURE_LINE
    if not last.startswith(prefix):
        return False
    want = key.mac_bytes(CONFIG_DOMAIN + name.encode() + b"\0", (body + "\n" if body else "").encode())
    return hmac.compare_digest(last[len(prefix):].strip(), want)
