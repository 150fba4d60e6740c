"""Workspace files in a capsule: a file list in chunks, contents in content-addressed chunks.

``capture(ns, files=DIR)`` records every regular file under ``DIR``; restore writes them
under ``files_to`` before anything is unpickled, so that open files, user modules and data
files are in place when the objects that refer to them are rebuilt.

Layout of ``manifest.files`` (the JSON that this module returns and reads)::

    {"version": 1, "root": "/abs/dir/at/capture",
     "manifest": {"size": ..., "codec": "zstd", "chunks": [...]},   # the file list
     "files": 120, "links": 2, "bytes": 12345678,                   # what the list holds
     "files_read": 3, "files_reused": 117,                          # incremental capture
     "secrets": [".env", ".aws/"],                                  # credentials left out
     "skipped": ["fifo: tmp/ctl (not a regular file)", ...]}

The file list itself is a zstd-compressed JSON buffer in chunks, so that a workspace with
many files keeps the signed capsule manifest small. It is sorted by path; an entry is

    {"path": "data/x.csv", "size": 10, "mode": 420, "hash": <BLAKE3 of the content>,
     "codec": "raw", "chunks": [...], "mtime_ns": ..., "ino": ..., "ctime_ns": ...}
    {"path": "latest", "type": "link", "target": "runs/7"}

``chunks`` cut the content at the repository's chunk size, like any buffer. Decisions:

* skipped: the repository itself when it lies inside the workspace, ``__pycache__``,
  ``.git``, ``.venv*`` and ``*.pyc`` (rebuilt or re-installed at the destination, and often
  large); sockets, fifos and devices (they are not data: listed under ``skipped``);
* credential files (:data:`sojourn.capsule.secrets.SECRET_PATTERNS`: ``.env*``, ``.aws/``, ``.ssh/``, ``*.pem``,
  ``*.key``, ``.netrc``, cloud CLI configs...) stay on the machine: left out, listed under
  ``secrets`` and ``skipped``, named in a :class:`~sojourn.errors.SojournWarning`; a
  capture takes them only when asked by name (``include_secrets``);
* symbolic links are recorded as links (not followed) when they point inside the
  workspace, with a relative target so that they work wherever the files are restored;
  links that point outside (or escape through ``..``) are skipped and listed, since their
  target is not part of the workspace and may not exist at the destination;
* empty directories are not recorded; modes keep the permission bits only (no setuid);
  modification times are restored, so that tools that compare times see the files as
  they were;
* incremental: with a parent capsule, a file whose (size, mtime_ns, inode, ctime_ns) did
  not change reuses the parent's chunk list and hash without being read;
* restore writes small files first, each through a temporary file and a rename, and leaves
  alone files already present with identical content; every path is checked to stay
  inside the destination, even though the manifest is signed.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import blake3

from sojourn.capsule.secrets import Secrets
from sojourn.errors import CaptureError, IntegrityError, RestoreError
from sojourn.repository.chunks import BufferRecord, ChunkStore, WriteStats

VERSION = 1
SKIPPED_DIRS = frozenset({"__pycache__", ".git"})
SKIPPED_DIR_PREFIXES = (".venv",)
SKIPPED_SUFFIXES = (".pyc",)
_BATCH_BYTES = 64 << 20  # small files read (or written) per parallel batch
_GROUP_CHUNKS = 16  # chunks of one large file in memory at once
_MAX_NOTES = 200
_EMPTY_HASH = blake3.blake3(b"").hexdigest()
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_BINARY = getattr(os, "O_BINARY", 0)


def is_skipped(rel: PurePosixPath) -> bool:
    """Whether a workspace-relative path falls in a part that snapshots leave out."""
    if rel.name.endswith(SKIPPED_SUFFIXES):
        return True
    return any(p in SKIPPED_DIRS or p.startswith(SKIPPED_DIR_PREFIXES) for p in rel.parts[:-1])


def safe_relative(rel: str) -> PurePosixPath:
    """``rel`` as a relative path that cannot leave its root; IntegrityError otherwise."""
    p = PurePosixPath(rel)
    if (
        not rel
        or "\x00" in rel
        or p.is_absolute()
        or rel.startswith("/")
        or any(part in ("..", ".", "") for part in rel.split("/"))
    ):
        raise IntegrityError(
            f"the capsule names the file {rel!r}, which is not a plain relative path inside "
            "the workspace; it was refused"
        )
    return p


def inside(root: Path, rel: str) -> Path:
    """The real location of ``rel`` under ``root``, refusing anything that resolves outside
    (a symbolic link already in the destination could redirect a write)."""
    path = root / safe_relative(rel)
    real_root = root.resolve()
    real = path.parent.resolve() / path.name
    if real != real_root and real_root not in real.parents:
        raise RestoreError(
            f"{path} resolves to {real}, outside {real_root} (a symbolic link in the "
            "destination points elsewhere); remove that link or restore into another directory"
        )
    return path


# -- capture ----------------------------------------------------------------------------------


def snapshot(
    root: Path,
    chunks: ChunkStore,
    stats: WriteStats,
    previous: dict[str, Any] | None = None,
    include_secrets: bool | Iterable[str] | None = None,
) -> dict[str, Any]:
    """Write the workspace's files to chunks; return the JSON for ``manifest.files``.

    Credential files are left out (and named in a warning) unless ``include_secrets`` takes
    them (see :class:`~sojourn.capsule.secrets.Secrets`)."""
    root = Path(root).absolute()
    if not root.is_dir():
        raise CaptureError(f"files={str(root)!r} is not a directory; pass the workspace directory", [])
    real_root = root.resolve()
    repo_root = getattr(chunks.backend, "root", None)
    skip_dir = Path(repo_root).resolve() if repo_root is not None else None
    known = _previous_entries(previous, chunks)

    notes: list[str] = []
    unreadable: list[str] = []
    regular: list[tuple[str, os.stat_result]] = []
    links: list[dict[str, Any]] = []
    secrets = Secrets(include_secrets)
    for rel, path, st in _walk(real_root, skip_dir, notes, unreadable, secrets):
        if stat.S_ISLNK(st.st_mode):
            target = _link_target(real_root, path, rel)
            if target is None:
                notes.append(f"symlink: {rel} (points outside the workspace)")
            else:
                links.append({"path": rel, "type": "link", "target": target})
        else:
            regular.append((rel, st))

    entries: list[dict[str, Any]] = []
    batch: list[tuple[dict[str, Any], bytes]] = []
    batch_bytes = 0
    reused = 0
    large = chunks.chunk_size * _GROUP_CHUNKS
    for rel, st in regular:
        old = known.get(rel)
        if old is not None and _same_file(old, st):
            entries.append(old)
            reused += 1
            continue
        path = real_root / rel
        try:
            # Not following links and not blocking: the entry may have been replaced (by a
            # link, or by a fifo whose open would wait for a writer) since it was listed.
            fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _NONBLOCK | _BINARY)
            with open(fd, "rb") as f:
                fst = os.fstat(f.fileno())
                if not stat.S_ISREG(fst.st_mode):
                    notes.append(f"{rel} (no longer a regular file)")
                    continue
                entry = _entry(rel, fst)
                if fst.st_size > large:
                    _put_large(f, entry, chunks, stats)
                    entries.append(entry)
                    continue
                data = f.read()
        except FileNotFoundError:
            continue  # deleted since the directory was listed: the program removed it
        except OSError as e:
            if e.errno == errno.ELOOP:
                notes.append(f"{rel} (replaced by a link while the workspace was read)")
                continue
            unreadable.append(f"{rel} ({e.strerror or e})")
            continue
        entry["size"] = len(data)
        entries.append(entry)
        batch.append((entry, data))
        batch_bytes += len(data)
        if batch_bytes >= _BATCH_BYTES:
            _put_batch(batch, chunks, stats)
            batch, batch_bytes = [], 0
    _put_batch(batch, chunks, stats)
    if unreadable:
        raise CaptureError(
            f"{len(unreadable)} workspace file(s) cannot be read, so the capsule would miss "
            "them; no capsule was written: " + "; ".join(unreadable[:20])
            + ". Fix their permissions or move them out of the workspace.",
            [],
        )

    notes += [f"secret: {rel} (credentials stay on this machine)" for rel in secrets.left_out]
    secrets.warn()
    listing = sorted(entries + links, key=lambda e: e["path"])
    raw = json.dumps(listing, separators=(",", ":")).encode()
    record = chunks.put(raw, stats, codec="zstd")
    return {
        "version": VERSION,
        "root": str(root),
        "manifest": record.to_json(),
        "files": len(entries),
        "links": len(links),
        "bytes": sum(e["size"] for e in entries),
        "files_read": len(entries) - reused,
        "files_reused": reused,
        "secrets": secrets.left_out,
        "skipped": notes[:_MAX_NOTES] + ([f"... and {len(notes) - _MAX_NOTES} more"] if len(notes) > _MAX_NOTES else []),
    }


def _walk(
    root: Path, skip_dir: Path | None, notes: list[str], unreadable: list[str], secrets: Secrets
) -> Iterator[tuple[str, Path, os.stat_result]]:
    """(relative posix path, path, lstat) of every file and link to consider, in order."""
    stack = [(root, "")]
    while stack:
        directory, prefix = stack.pop()
        try:
            with os.scandir(directory) as it:
                items = sorted(it, key=lambda e: e.name)
        except FileNotFoundError:
            continue
        except OSError as e:
            unreadable.append(f"{prefix or '.'}/ ({e.strerror or e})")
            continue
        subdirs = []
        for item in items:
            rel = prefix + item.name
            path = Path(item.path)
            try:
                st = item.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(st.st_mode):
                if item.name in SKIPPED_DIRS or item.name.startswith(SKIPPED_DIR_PREFIXES):
                    continue
                if skip_dir is not None and path == skip_dir:
                    continue
                if secrets.leaves_out(rel, is_dir=True):
                    continue
                subdirs.append((path, rel + "/"))
            elif stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
                if item.name.endswith(SKIPPED_SUFFIXES) and not stat.S_ISLNK(st.st_mode):
                    continue
                if not secrets.leaves_out(rel, is_dir=False):
                    yield rel, path, st
            else:
                kind = "fifo" if stat.S_ISFIFO(st.st_mode) else "socket" if stat.S_ISSOCK(st.st_mode) else "device"
                notes.append(f"{kind}: {rel} (not a regular file)")
        stack.extend(reversed(subdirs))


def _link_target(root: Path, path: Path, rel: str) -> str | None:
    """The link's target relative to its directory if it stays inside ``root``, else None."""
    target = os.readlink(path)
    base = os.path.dirname(os.path.join(str(root), rel))
    lexical = os.path.normpath(os.path.join(base, target))
    real = os.path.realpath(path)
    root_s = str(root)
    for p in (lexical, real):
        if p != root_s and not p.startswith(root_s + os.sep):
            return None
    if os.path.isabs(target):
        target = os.path.relpath(lexical, base)
    return Path(target).as_posix()


def _entry(rel: str, st: os.stat_result) -> dict[str, Any]:
    return {
        "path": rel,
        "size": st.st_size,
        "mode": stat.S_IMODE(st.st_mode) & 0o777,
        "hash": _EMPTY_HASH,
        "codec": "raw",
        "chunks": [],
        "mtime_ns": st.st_mtime_ns,
        "ino": st.st_ino,
        "ctime_ns": st.st_ctime_ns,
    }


def _same_file(old: dict[str, Any], st: os.stat_result) -> bool:
    return (
        old.get("size") == st.st_size
        and old.get("mtime_ns") == st.st_mtime_ns
        and old.get("ino") == st.st_ino
        and old.get("ctime_ns") == st.st_ctime_ns
    )


def _put_batch(batch: list[tuple[dict[str, Any], bytes]], chunks: ChunkStore, stats: WriteStats) -> None:
    if not batch:
        return
    records = chunks.put_many([memoryview(data) for _, data in batch], stats)
    for (entry, data), rec in zip(batch, records, strict=True):
        entry["codec"], entry["chunks"] = rec.codec, rec.chunks
        # A one-chunk file's chunk hash is already the BLAKE3 of its content.
        if len(rec.chunks) == 1:
            entry["hash"] = rec.chunks[0]
        elif rec.chunks:
            entry["hash"] = blake3.blake3(data, max_threads=blake3.blake3.AUTO).hexdigest()


def _put_large(f: Any, entry: dict[str, Any], chunks: ChunkStore, stats: WriteStats) -> None:
    """Stream a large file through the chunk store a group of chunks at a time.

    Every piece but the last is exactly one chunk long, so the chunk list is the one the
    whole file would have had; the codec is decided once, on the first chunk, because a
    record has one codec for all its chunks.
    """
    h = blake3.blake3(max_threads=blake3.blake3.AUTO)
    codec = "auto"
    names: list[str] = []
    size = 0
    eof = False
    while not eof:
        pieces: list[bytes] = []
        while len(pieces) < _GROUP_CHUNKS:
            piece = _read_exact(f, chunks.chunk_size)
            if piece:
                pieces.append(piece)
            if len(piece) < chunks.chunk_size:
                eof = True
                break
        for piece in pieces:
            h.update(piece)
            size += len(piece)
        if pieces and codec == "auto":
            first = chunks.put(pieces.pop(0), stats)
            codec = first.codec
            names.extend(first.chunks)
        for rec in chunks.put_many([memoryview(p) for p in pieces], stats, codec=codec):
            names.extend(rec.chunks)
    entry.update(size=size, codec=codec if names else "raw", chunks=names, hash=h.hexdigest())


def _read_exact(f: Any, n: int) -> bytes:
    parts = []
    left = n
    while left:
        b = f.read(left)
        if not b:
            break
        parts.append(b)
        left -= len(b)
    return b"".join(parts)


def _previous_entries(previous: dict[str, Any] | None, chunks: ChunkStore) -> dict[str, dict[str, Any]]:
    if not previous or previous.get("version") != VERSION or not previous.get("manifest"):
        return {}
    return {e["path"]: e for e in load_entries(previous, chunks) if e.get("type", "file") == "file"}


# -- reading the list ---------------------------------------------------------------------------


def load_entries(files_json: dict[str, Any], chunks: ChunkStore) -> list[dict[str, Any]]:
    """The file list of a capsule (its chunks are checked as they are read)."""
    version = files_json.get("version")
    if version != VERSION:
        raise IntegrityError(
            f"the capsule's workspace files have layout version {version!r}; this sojourn reads "
            f"version {VERSION}. Upgrade sojourn to read them."
        )
    raw = chunks.get(BufferRecord.from_json(files_json["manifest"]))
    try:
        entries = json.loads(bytes(raw))
    except ValueError as e:
        raise IntegrityError(f"the capsule's file list is not valid JSON ({e})") from None
    if not isinstance(entries, list):
        raise IntegrityError("the capsule's file list is not a list")
    return entries


def list_entries(files_json: dict[str, Any], chunks: ChunkStore) -> list[dict[str, Any]]:
    """For ``sojourn inspect``: path, size, mode and hash of each file (links: target)."""
    out = []
    for e in load_entries(files_json, chunks):
        if e.get("type", "file") == "link":
            out.append({"path": e["path"], "size": 0, "mode": 0o777, "hash": "", "target": e["target"]})
        else:
            out.append({"path": e["path"], "size": e["size"], "mode": e["mode"], "hash": e["hash"]})
    return out


def content_chunk_names(files_json: dict[str, Any], chunks: ChunkStore) -> list[str]:
    """The names of the chunks that hold the files' contents (for garbage collection)."""
    names: list[str] = []
    for e in load_entries(files_json, chunks):
        if e.get("type", "file") == "file":
            names.extend(chunks.naming(h, e["codec"]) for h in e["chunks"])
    return names


# -- restore ------------------------------------------------------------------------------------


def materialize(files_json: dict[str, Any], chunks: ChunkStore, dest: Path) -> None:
    """Write the capsule's files under ``dest``: small files first, each atomically."""
    entries = load_entries(files_json, chunks)
    for e in entries:  # refuse a bad path before anything is written
        safe_relative(str(e.get("path", "")))
        if e.get("type", "file") == "link":
            _check_link(str(e["path"]), str(e.get("target", "")))
        elif e.get("type", "file") != "file":
            raise IntegrityError(f"the capsule's file list has an entry of unknown type {e.get('type')!r}")
    dest = Path(dest).absolute()
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise RestoreError(f"cannot create {dest} to restore the workspace files into: {err.strerror or err}") from err
    files = sorted((e for e in entries if e.get("type", "file") == "file"), key=lambda e: (e["size"], e["path"]))
    large = chunks.chunk_size * _GROUP_CHUNKS
    batch: list[tuple[dict[str, Any], Path, bytearray]] = []
    batch_bytes = 0
    for e in files:
        path = _prepare(dest, e["path"])
        if _already_there(path, e):
            continue
        if e["size"] > large:
            _flush_batch(batch, chunks)
            batch, batch_bytes = [], 0
            _write_large(path, e, chunks)
            continue
        batch.append((e, path, bytearray(e["size"])))
        batch_bytes += e["size"]
        if batch_bytes >= _BATCH_BYTES:
            _flush_batch(batch, chunks)
            batch, batch_bytes = [], 0
    _flush_batch(batch, chunks)
    for e in entries:
        if e.get("type") == "link":
            _make_link(_prepare(dest, e["path"]), e["target"])


def _check_link(rel: str, target: str) -> None:
    parts = PurePosixPath(rel).parent.parts
    depth = len(parts)
    if not target or target.startswith("/") or "\x00" in target:
        raise IntegrityError(f"the capsule's link {rel!r} -> {target!r} does not stay inside the workspace")
    for part in target.split("/"):
        if part == "..":
            depth -= 1
        elif part not in ("", "."):
            depth += 1
        if depth < 0:
            raise IntegrityError(f"the capsule's link {rel!r} -> {target!r} does not stay inside the workspace")


def _prepare(dest: Path, rel: str) -> Path:
    path = dest / safe_relative(rel)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise RestoreError(
            f"cannot restore {rel}: a file in {dest} is where one of its directories should be; "
            "move it away or restore into another directory"
        ) from None
    except OSError as e:
        raise RestoreError(f"cannot create the directory of {rel} in {dest}: {e.strerror or e}") from e
    return inside(dest, rel)


def _already_there(path: Path, e: dict[str, Any]) -> bool:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(st.st_mode) or st.st_size != e["size"]:
        return False
    h = blake3.blake3(max_threads=blake3.blake3.AUTO)
    try:
        with open(path, "rb") as f:
            while block := f.read(1 << 22):
                h.update(block)
    except OSError:
        return False
    if h.hexdigest() != e["hash"]:
        return False
    if stat.S_IMODE(st.st_mode) & 0o777 != e["mode"]:
        os.chmod(path, e["mode"])
    return True


def _flush_batch(batch: list[tuple[dict[str, Any], Path, bytearray]], chunks: ChunkStore) -> None:
    if not batch:
        return
    chunks.get_many((_record(e), memoryview(buf)) for e, _, buf in batch)
    for e, path, buf in batch:
        _write_atomically(path, e, [buf])


def _write_large(path: Path, e: dict[str, Any], chunks: ChunkStore) -> None:
    cs = chunks.chunk_size

    def pieces() -> Iterator[bytearray]:
        names = e["chunks"]
        for i in range(0, len(names), _GROUP_CHUNKS):
            group = names[i : i + _GROUP_CHUNKS]
            size = min(len(group) * cs, e["size"] - i * cs)
            buf = bytearray(size)
            chunks.get_into(BufferRecord(size, e["codec"], group), memoryview(buf))
            yield buf

    _write_atomically(path, e, pieces())


def _record(e: dict[str, Any]) -> BufferRecord:
    return BufferRecord(size=e["size"], codec=e["codec"], chunks=list(e["chunks"]))


def _write_atomically(path: Path, e: dict[str, Any], pieces: Any) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.sojourn-tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _BINARY, 0o600)
        with open(fd, "wb") as f:
            for piece in pieces:
                f.write(piece)
        os.chmod(tmp, e["mode"] & 0o777)
        if "mtime_ns" in e:
            os.utime(tmp, ns=(e["mtime_ns"], e["mtime_ns"]))
        os.replace(tmp, path)
    except IsADirectoryError:
        _remove(tmp)
        raise RestoreError(f"cannot restore {path}: a directory is in its place; move it away") from None
    except OSError as err:
        _remove(tmp)
        raise RestoreError(f"cannot write {path}: {err.strerror or err}") from err
    except BaseException:
        _remove(tmp)
        raise


def _make_link(path: Path, target: str) -> None:
    try:
        if os.readlink(path) == target:
            return
    except OSError:
        pass
    if path.is_dir() and not path.is_symlink():
        raise RestoreError(f"cannot restore the link {path}: a directory is in its place; move it away")
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.sojourn-tmp")
    try:
        os.symlink(target, tmp)
        os.replace(tmp, path)
    except OSError as err:
        _remove(tmp)
        raise RestoreError(f"cannot create the link {path} -> {target}: {err.strerror or err}") from err


def _remove(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
