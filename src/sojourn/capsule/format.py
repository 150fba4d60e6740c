"""The capsule manifest: a signed, versioned JSON document naming every chunk of a capsule.

See ``docs/capsule-format.md`` for the layout, examples and invariants. In short:

* a manifest is written once, after every chunk it names is durable;
* its id is ``cap_`` + the BLAKE3 hash of its canonical JSON (without id and signature);
* it is signed with HMAC-SHA256 under the repository key; a reader checks the format name,
  the version, the id and the signature, and refuses anything else *before* unpickling.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import blake3

from sojourn.errors import IntegrityError, ObjectNotFound
from sojourn.repository.chunks import BufferRecord, ChunkStore
from sojourn.repository.repo import Repository

FORMAT = "sojourn.capsule"
VERSION = 1
PROCESS_SEGMENT = "<process>"  # the last segment: RNG states and other process-wide state


@dataclass
class Variable:
    name: str
    type: str
    size: int  # bytes of its stream segment plus the buffers it owns
    fingerprint: str
    segment: tuple[int, int]  # [start, end) in the stream
    buffers: tuple[int, int]  # [first, last) index into Manifest.buffers

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["segment"] = list(self.segment)
        d["buffers"] = list(self.buffers)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Variable:
        return cls(
            name=d["name"],
            type=d["type"],
            size=int(d["size"]),
            fingerprint=d["fingerprint"],
            segment=(int(d["segment"][0]), int(d["segment"][1])),
            buffers=(int(d["buffers"][0]), int(d["buffers"][1])),
        )


@dataclass
class Buffer:
    kind: str
    meta: dict[str, Any]
    record: BufferRecord

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "meta": self.meta, **self.record.to_json()}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Buffer:
        return cls(kind=d["kind"], meta=d.get("meta", {}), record=BufferRecord.from_json(d))


@dataclass
class Manifest:
    stream: BufferRecord
    variables: list[Variable]
    buffers: list[Buffer]
    parent: str | None = None
    created: str = ""
    environment: dict[str, Any] = field(default_factory=dict)
    distributions: dict[str, str] = field(default_factory=dict)
    # What the environment must have (docs/environment.md): library module -> distribution,
    # version and the variables that need it; and every distribution in use with its origin.
    needs: dict[str, dict[str, Any]] = field(default_factory=dict)
    packages: dict[str, dict[str, Any]] = field(default_factory=dict)
    user_modules: dict[str, dict[str, Any]] = field(default_factory=dict)
    files: dict[str, Any] | None = None
    devices: list[str] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)
    labels: dict[str, Any] = field(default_factory=dict)
    id: str = ""
    version: int = VERSION
    # The byte order of the stream's and buffers' binary values: little on every machine
    # (docs/capsule-format.md, "Byte order"). Capsules written before it was recorded are
    # in their writer's order (``environment.byteorder``).
    byteorder: str = "little"

    def body(self) -> dict[str, Any]:
        body = {
            "format": FORMAT,
            "version": self.version,
            "byteorder": self.byteorder,
            "parent": self.parent,
            "created": self.created,
            "environment": self.environment,
            "distributions": self.distributions,
            "stream": self.stream.to_json(),
            "variables": [v.to_json() for v in self.variables],
            "buffers": [b.to_json() for b in self.buffers],
            "user_modules": self.user_modules,
            "files": self.files,
            "devices": self.devices,
            "stats": self.stats,
            "labels": self.labels,
        }
        # Only when there are any: a capsule of plain values keeps the id it had before.
        if self.needs:
            body["needs"] = self.needs
        if self.packages:
            body["packages"] = self.packages
        return body

    @property
    def size(self) -> int:
        return self.stream.size + sum(b.record.size for b in self.buffers)

    def all_chunk_names(self, chunks: ChunkStore | None = None) -> list[str]:
        """Every chunk the capsule needs, by object name. The workspace files' chunks are named
        in the file list, itself a buffer (so that the manifest stays small): listing them
        needs ``chunks`` to read it, and is refused without it rather than silently
        incomplete. Without ``chunks``, names are a plain repository's."""
        def named(rec: BufferRecord) -> list[str]:
            # An encrypted repository names chunks with its key: only its store knows how.
            return chunks.names(rec) if chunks is not None else rec.names()

        names = named(self.stream)
        for b in self.buffers:
            names.extend(named(b.record))
        if self.files and self.files.get("manifest"):
            names.extend(named(BufferRecord.from_json(self.files["manifest"])))
            if chunks is None:
                raise ValueError("this capsule has workspace files: pass the chunk store to list their chunks")
            from sojourn.capsule.workspace_files import content_chunk_names

            names.extend(content_chunk_names(self.files, chunks))
        return names


def environment() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "implementation": sys.implementation.name,
        "machine": platform.machine(),
        "byteorder": sys.byteorder,
        "platform": sys.platform,
    }


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _canonical(obj: Any) -> bytes:
    # surrogatepass: a name Python allows but UTF-8 cannot spell (a variable whose name holds
    # a lone surrogate, from os.fsdecode of a file name) still has canonical bytes; for every
    # other text these are the UTF-8 bytes, so no capsule's id changes.
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass")


def seal(manifest: Manifest, key: bytes) -> bytes:
    """Give ``manifest`` its id and return the signed document to store."""
    body = manifest.body()
    manifest.id = "cap_" + blake3.blake3(_canonical(body)).hexdigest()[:32]
    doc = {"id": manifest.id, **body}
    doc["signature"] = hmac.new(key, _canonical(doc), hashlib.sha256).hexdigest()
    return json.dumps(doc, indent=1, sort_keys=True).encode()


def open_manifest(raw: bytes, key: bytes, expected_id: str | None = None) -> Manifest:
    """Parse and check a stored manifest; raise IntegrityError before trusting anything."""
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise IntegrityError(
            f"capsule manifest {expected_id or ''} is truncated or not JSON ({e}); it was "
            "damaged after it was written"
        ) from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise IntegrityError(f"{expected_id or 'the object'} is not a sojourn capsule manifest")
    version = doc.get("version")
    if version != VERSION:
        raise IntegrityError(
            f"capsule {doc.get('id', expected_id)} has format version {version!r}; this sojourn "
            f"reads version {VERSION}. Upgrade sojourn to read it."
        )
    signature = doc.pop("signature", None)
    want = hmac.new(key, _canonical(doc), hashlib.sha256).hexdigest()
    if not isinstance(signature, str) or not hmac.compare_digest(signature, want):
        raise IntegrityError(
            f"capsule {doc.get('id', expected_id)} has a bad signature: it was altered after it "
            "was written, or it was written with another repository key (check SOJOURN_KEY "
            "and ~/.sojourn/keys). Nothing was unpickled."
        )
    cap_id = doc.pop("id", None)
    body = doc
    if cap_id != "cap_" + blake3.blake3(_canonical(body)).hexdigest()[:32]:
        raise IntegrityError(f"capsule {cap_id} does not match its id")
    if expected_id is not None and cap_id != expected_id:
        raise IntegrityError(f"the manifest stored as {expected_id} is capsule {cap_id}")
    try:
        return Manifest(
            id=cap_id,
            version=int(body["version"]),
            parent=body.get("parent"),
            created=body.get("created", ""),
            environment=body.get("environment", {}),
            distributions=body.get("distributions", {}),
            needs=body.get("needs", {}),
            packages=body.get("packages", {}),
            stream=BufferRecord.from_json(body["stream"]),
            variables=[Variable.from_json(v) for v in body["variables"]],
            buffers=[Buffer.from_json(b) for b in body["buffers"]],
            user_modules=body.get("user_modules", {}),
            files=body.get("files"),
            devices=body.get("devices", []),
            stats=body.get("stats", {}),
            labels=body.get("labels", {}),
            byteorder=body.get("byteorder") or body.get("environment", {}).get("byteorder") or "little",
        )
    except (KeyError, TypeError, ValueError) as e:
        raise IntegrityError(f"capsule {cap_id} has a malformed manifest ({e})") from None


def check_readable(manifest: Manifest) -> None:
    """Refuse, before anything is read, a capsule whose byte order this sojourn cannot read."""
    if manifest.byteorder != "little":
        where = manifest.environment.get("machine", "a big-endian machine")
        raise IntegrityError(
            f"capsule {manifest.id} was written on {where} by a sojourn older than the "
            f"byte-order-independent format: its values are in {manifest.byteorder}-endian "
            "order. Restore it there with the sojourn that wrote it, then capture it again."
        )
    if sys.byteorder != "little" and any(b.kind == "torch-storage" for b in manifest.buffers):
        raise IntegrityError(
            f"capsule {manifest.id} holds torch tensors, which sojourn cannot yet swap to this "
            "machine's big-endian byte order: restore it on a little-endian machine (x86_64, arm64)"
        )


def resolve_id(repo: Repository, capsule: str) -> str:
    """Accept a full id, a unique prefix (with or without ``cap_``)."""
    name = capsule if capsule.startswith("cap_") else "cap_" + capsule
    if repo.backend.stat("capsules", name + ".json") is not None:
        return name
    matches = [n[: -len(".json")] for n in repo.backend.list("capsules", name) if n.endswith(".json")]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise ObjectNotFound(f"no capsule {capsule!r} in {repo.url}")
    raise ObjectNotFound(f"{capsule!r} is ambiguous in {repo.url}: {', '.join(matches[:5])}")


def load_manifest(repo: Repository, capsule: str) -> Manifest:
    cap_id = resolve_id(repo, capsule)
    raw = repo.backend.load("capsules", cap_id + ".json")
    return open_manifest(raw, repo.key, expected_id=cap_id)


def store_manifest(repo: Repository, manifest: Manifest) -> str:
    doc = seal(manifest, repo.key)
    repo.backend.flush()  # chunks are durable before the manifest that names them
    name = manifest.id + ".json"
    if repo.backend.stat("capsules", name) is None:
        repo.backend.save("capsules", name, doc)
        repo.backend.flush()
    return manifest.id
