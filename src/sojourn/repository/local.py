"""A repository in a local directory.

Every object is written to a temporary file, fsynced, then renamed into place (linked,
for an exclusive create, so that losing the race is an error rather than an overwrite).
Directory fsyncs are batched into :meth:`LocalBackend.flush` so that a capture that writes
hundreds of chunks pays for one fsync per directory, not one per chunk; the write order
chunks → flush → manifest keeps the invariant that a manifest never names a chunk that a
crash could lose.

When memory is tight, large objects (chunks) are written with ``O_DIRECT`` where the
filesystem allows it, through a page-aligned bounce buffer per thread, and reads of large
objects drop their page-cache copy once the bytes are in the program's memory
(``posix_fadvise(DONTNEED)``). A capture of 1 GiB then needs no free memory beyond 4 MiB a
writer thread, and a restore does not hold a second copy of what it restored: that matters
exactly when sojourn is called on a machine near its memory limit (an out-of-memory capture,
a restore on a machine sized to fit). With memory to spare, the page cache is worth its
memory: the next reader of a capsule is often on the same machine (a notebook's move or
resume, an out-of-memory resume on a bigger local machine), and reads it back from memory
(a 1 GiB kernel restored in 0.62 s from the cache, 1.11 s from the disk of the VM measured
here). Tight means less than 2 GiB or a fifth of the machine available, counting the memory
cgroup's limit (:func:`memory_headroom`). ``SOJOURN_DIRECT_IO=1`` always bypasses the page
cache, ``=0`` never; a filesystem that refuses ``O_DIRECT`` is written through it.

Measured on a VM whose memory is backed lazily, where it matters most: buffered writes into
memory nothing had touched for a while cost 2.6 s of system time per GiB against 0.25 s
direct (on recycled memory both ran at the same speed), and a 1 GiB move paused its program
1.7 s with both switched on against 2.3 s with both off.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from sojourn.errors import (
    AlreadyExists,
    ObjectNotFound,
    RepositoryError,
    RepositoryNotFound,
    StoreUnavailable,
)
from sojourn.repository.backend import KINDS, check_kind, check_name
from sojourn.threads import Executor

_SHARDED = {"chunks"}  # many objects: spread over 256 subdirectories
_DIRECT_MIN = 1 << 20  # smaller objects (manifests, records, small chunks) gain nothing
_ALIGN = 4096  # O_DIRECT wants address, length and offset aligned to the logical block size
_BOUNCE = 4 << 20
_O_DIRECT = getattr(os, "O_DIRECT", 0)
_bounce = threading.local()
_TIGHT_BELOW = 2 << 30  # bytes available; or a fifth of the machine, whichever is more
_tight_seen: list[float | bool] = [-1.0, False]  # when last asked, and the answer


def memory_headroom() -> tuple[int, int] | None:
    """(bytes available, bytes in all) for this process: the machine's MemAvailable, or its
    memory cgroup's room under ``memory.max`` when that is smaller; None where unknown."""
    try:
        info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
        avail, total = int(info["MemAvailable"].split()[0]) * 1024, int(info["MemTotal"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None
    for line in _read("/proc/self/cgroup").splitlines():
        hier, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hier == "0" and not controllers:  # cgroup v2
            base = Path("/sys/fs/cgroup") / path.strip().lstrip("/")
            limit, used = _read(base / "memory.max"), _read(base / "memory.current")
        elif "memory" in controllers.split(","):  # cgroup v1
            base = Path("/sys/fs/cgroup/memory") / path.strip().lstrip("/")
            limit, used = _read(base / "memory.limit_in_bytes"), _read(base / "memory.usage_in_bytes")
        else:
            continue
        if limit.isdigit() and used.isdigit() and int(limit) < total:  # v1 says "no limit" as ~2**63
            avail, total = min(avail, max(0, int(limit) - int(used))), int(limit)
    return avail, total


def _read(path: str | Path) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def memory_tight() -> bool:
    """Whether the page cache would compete with the program for memory (asked at most twice
    a second: a capture writes hundreds of chunks)."""
    now = time.monotonic()
    if now - float(_tight_seen[0]) < 0.5:
        return bool(_tight_seen[1])
    room = memory_headroom()
    tight = room is not None and room[0] < max(_TIGHT_BELOW, room[1] // 5)
    _tight_seen[:] = [now, tight]
    return tight


def _bypass_cache() -> bool:
    mode = os.environ.get("SOJOURN_DIRECT_IO", "auto").strip().lower()
    if mode in ("0", "no", "off", "false"):
        return False
    if mode in ("1", "yes", "on", "true"):
        return True
    return memory_tight()


def _bounce_buffer() -> tuple[mmap.mmap, int]:
    # An anonymous mapping is page aligned; one per thread, reused for every object it writes.
    got = getattr(_bounce, "buf", None)
    if got is None:
        buf = mmap.mmap(-1, _BOUNCE)
        got = _bounce.buf = (buf, ctypes.addressof(ctypes.c_char.from_buffer(buf)))
    return got  # type: ignore[no-any-return]


def _copy_in(whole: memoryview, address: int, piece: memoryview) -> None:
    # ctypes.memmove runs without the GIL: a slice assignment would copy a whole capture's
    # bytes while holding it, against the thread that pickles the next variables.
    try:
        src = ctypes.addressof(ctypes.c_char.from_buffer(piece))
    except (TypeError, ValueError):  # read-only (bytes: the stream, compressed chunks)
        whole[: len(piece)] = piece
    else:
        ctypes.memmove(address, src, len(piece))


def _write_direct(fd: int, view: memoryview) -> None:
    """Write ``view`` to ``fd`` (opened with O_DIRECT) through the bounce buffer, padding the
    last block with zeros, then cut the file to the object's size."""
    buf, address = _bounce_buffer()
    whole = memoryview(buf)
    try:
        for start in range(0, len(view), _BOUNCE):
            piece = view[start : start + _BOUNCE]
            n = len(piece)
            _copy_in(whole, address, piece)
            padded = -(-n // _ALIGN) * _ALIGN
            if padded > n:
                whole[n:padded] = bytes(padded - n)
            out = whole[:padded]
            while out:
                written = os.write(fd, out)
                out = out[written:]
        os.ftruncate(fd, len(view))
    finally:
        whole.release()


# Errors that may pass by themselves: a disk or a network filesystem having a bad moment, a
# FUSE mount whose daemon restarts. They are retried (repository/retry.py); anything else
# (no space, permission, a missing repository) fails at once.
TRANSIENT_ERRNOS = frozenset(
    getattr(errno, name)
    for name in ("EIO", "EAGAIN", "EWOULDBLOCK", "EINTR", "ETIMEDOUT", "EBUSY", "ESTALE", "ENOLCK", "ENOTCONN",
                 "ECONNRESET", "ECONNABORTED", "ECONNREFUSED", "EHOSTDOWN", "EHOSTUNREACH", "ENETDOWN",
                 "ENETUNREACH", "ENETRESET", "EREMOTEIO")
    if hasattr(errno, name)
)


def os_error(exc: OSError, action: str, path: Path | str) -> RepositoryError:
    """Turn an OSError into a message that says what happened and what to do."""
    if exc.errno == errno.ENOSPC or exc.errno == getattr(errno, "EDQUOT", -1):
        what = "no space left on the device" if exc.errno == errno.ENOSPC else "the disk quota is exhausted"
        return RepositoryError(
            f"{what} while {action} {path}; nothing was published, "
            "the previous capsules are intact. Free some space and try again."
        )
    if exc.errno in TRANSIENT_ERRNOS:
        name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
        return StoreUnavailable(f"{action} {path} failed: {exc.strerror or exc} ({name})")
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return RepositoryError(
            f"permission denied while {action} {path}: the repository is not writable by this "
            "user. Choose another repository (--repo / $SOJOURN_REPO) or fix its permissions."
        )
    if exc.errno == errno.ENOTDIR:
        return RepositoryNotFound(f"{path} is not a directory: a repository must be a directory")
    return RepositoryError(f"{action} {path} failed: {exc.strerror or exc}")


class LocalBackend:
    def __init__(self, root: str | os.PathLike[str]):
        self.root = Path(root).expanduser().absolute()
        self.url = str(self.root)
        self._dirty: set[Path] = set()
        self._lock = threading.Lock()
        self._made: set[Path] = set()
        # None: not tried yet on this filesystem; False after it refused O_DIRECT once.
        self._direct: bool | None = None if _O_DIRECT else False

    # -- location ---------------------------------------------------------------------------

    def exists(self) -> bool:
        return self.root.is_dir()

    def create(self) -> None:
        if self.root.exists() and not self.root.is_dir():
            raise RepositoryNotFound(f"{self.root} exists and is not a directory")
        if not self.root.parent.is_dir():
            raise RepositoryNotFound(
                f"cannot create a repository at {self.root}: its parent directory "
                f"{self.root.parent} does not exist"
            )
        try:
            self.root.mkdir(exist_ok=True)
            for kind in KINDS:
                (self.root / kind).mkdir(exist_ok=True)
            _fsync_dir(self.root)
        except OSError as e:
            raise os_error(e, "creating the repository at", self.root) from e

    def _path(self, kind: str, name: str) -> Path:
        check_kind(kind)
        check_name(name)
        if kind in _SHARDED:
            return self.root / kind / name[:2] / name
        return self.root / kind / name

    # -- objects ----------------------------------------------------------------------------

    def save(self, kind: str, name: str, data: bytes | memoryview, *, exclusive: bool = False) -> None:
        path = self._path(kind, name)
        parent = path.parent
        if parent not in self._made:
            self._make_parent(kind, parent)
            self._made.add(parent)
        tmp = parent / f".tmp-{uuid.uuid4().hex}"
        try:
            self._write_new(tmp, memoryview(data).cast("B"))
            if exclusive:
                try:
                    os.link(tmp, path)
                except FileExistsError:
                    raise AlreadyExists(f"{kind}/{name} already exists in {self.url}") from None
                finally:
                    os.unlink(tmp)
            else:
                os.replace(tmp, path)
        except AlreadyExists:
            raise
        except OSError as e:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            if e.errno == errno.ENOENT and not self._intact():
                raise self._gone(f"{kind}/{name}") from None
            raise os_error(e, f"writing {kind}/{name} to", self.url) from e
        with self._lock:
            self._dirty.add(parent)
            if kind in _SHARDED:
                self._dirty.add(parent.parent)

    def _intact(self) -> bool:
        return (self.root / "config").is_dir()

    def _gone(self, what: str) -> RepositoryNotFound:
        return RepositoryNotFound(
            f"the repository at {self.root} is gone (its config/ directory is missing: deleted, moved or "
            f"unmounted), so {what} was not written; a repository is never re-created by a write. "
            "Mount or restore it, or choose another one"
        )

    def _make_parent(self, kind: str, parent: Path) -> None:
        # Only one level: the shard, or a kind's directory a repository made by an older
        # sojourn lacks. Creating every missing level would rebuild a deleted or unmounted
        # repository's tree and write into it as if nothing had happened.
        kind_dir = self.root / kind
        try:
            if parent == kind_dir or not kind_dir.is_dir():
                if not kind_dir.is_dir() and not self._intact():
                    raise self._gone(f"an object of {kind}/")
                kind_dir.mkdir(exist_ok=True)
            if parent != kind_dir:
                parent.mkdir(exist_ok=True)
        except RepositoryError:
            raise
        except OSError as e:
            raise os_error(e, "creating", parent) from e

    def _write_new(self, tmp: Path, view: memoryview) -> None:
        """Create ``tmp`` with exactly ``view``'s bytes, durable (fsynced) on return."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
        if len(view) >= _DIRECT_MIN and self._direct is not False and _bypass_cache():
            try:
                fd = os.open(tmp, flags | _O_DIRECT, 0o644)
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
                self._direct = False  # this filesystem has no O_DIRECT (tmpfs): page cache
            else:
                try:
                    _write_direct(fd, view)
                    os.fsync(fd)
                    self._direct = True
                    return
                except OSError as e:
                    # Accepted at open, refused at write (an alignment this filesystem does
                    # not take): write through the page cache from now on.
                    if e.errno != errno.EINVAL:
                        raise
                    self._direct = False
                finally:
                    os.close(fd)
                os.unlink(tmp)
        fd = os.open(tmp, flags, 0o644)
        try:
            while view:
                n = os.write(fd, view)
                view = view[n:]
            os.fsync(fd)
        finally:
            os.close(fd)

    def _drop_cached(self, fd: int, size: int) -> None:
        # A large object read is now in the program's own memory (an array, a tensor): when
        # memory is tight its page-cache copy would double what the restore takes, and filling
        # the cache touches as much fresh memory again (on the lazily backed VM measured here,
        # a 1 GiB move's restore spent 3 s of system time on it). Dropping each chunk's pages
        # once read lets the next read reuse them.
        if size >= _DIRECT_MIN and hasattr(os, "posix_fadvise") and _bypass_cache():
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            except OSError:
                pass  # advice only

    def load(self, kind: str, name: str) -> bytes:
        path = self._path(kind, name)
        try:
            with open(path, "rb") as f:
                data = f.read()
                self._drop_cached(f.fileno(), len(data))
                return data
        except FileNotFoundError:
            raise ObjectNotFound(f"{kind}/{name} not found in {self.url}") from None
        except OSError as e:
            raise os_error(e, "reading", path) from e

    def load_into(self, kind: str, name: str, out: memoryview) -> int:
        path = self._path(kind, name)
        try:
            with open(path, "rb", buffering=0) as f:
                size = os.fstat(f.fileno()).st_size
                if size != len(out):
                    raise ObjectNotFound(
                        f"{kind}/{name} in {self.url} is {size} bytes, expected {len(out)} "
                        "(truncated or replaced)"
                    )
                got = 0
                while got < size:
                    n = f.readinto(out[got:])
                    if not n:
                        break
                    got += n
                self._drop_cached(f.fileno(), size)
                return got
        except FileNotFoundError:
            raise ObjectNotFound(f"{kind}/{name} not found in {self.url}") from None
        except OSError as e:
            raise os_error(e, "reading", path) from e

    def load_scatter(self, kind: str, name: str, parts: list[memoryview]) -> int:
        """Read the object into ``parts`` in order when its size is their total; return its
        size (nothing is read when it differs). An encrypted chunk's ciphertext goes straight
        into the array it belongs to, its header and tag into small buffers."""
        path = self._path(kind, name)
        try:
            with open(path, "rb", buffering=0) as f:
                size = os.fstat(f.fileno()).st_size
                if size != sum(len(p) for p in parts):
                    return size
                for part in parts:
                    got = 0
                    while got < len(part):
                        n = f.readinto(part[got:])
                        if not n:
                            raise ObjectNotFound(f"{kind}/{name} in {self.url} was cut short while it was read")
                        got += n
                self._drop_cached(f.fileno(), size)
                return size
        except FileNotFoundError:
            raise ObjectNotFound(f"{kind}/{name} not found in {self.url}") from None
        except OSError as e:
            raise os_error(e, "reading", path) from e

    def stat(self, kind: str, name: str) -> int | None:
        try:
            return self._path(kind, name).stat().st_size
        except FileNotFoundError:
            return None
        except OSError as e:
            raise os_error(e, "reading", self._path(kind, name)) from e

    def list(self, kind: str, prefix: str = "") -> Iterator[str]:
        check_kind(kind)
        base = self.root / kind
        if not base.is_dir():
            return
        if kind in _SHARDED:
            dirs = sorted(p for p in base.iterdir() if p.is_dir())
        else:
            dirs = [base]
        for d in dirs:
            for entry in sorted(os.listdir(d)):
                if entry.startswith("."):
                    continue
                if entry.startswith(prefix) and (d / entry).is_file():
                    yield entry

    def remove(self, kind: str, name: str) -> None:
        path = self._path(kind, name)
        try:
            path.unlink()
        except FileNotFoundError:
            raise ObjectNotFound(f"{kind}/{name} not found in {self.url}") from None
        except OSError as e:
            raise os_error(e, "removing", path) from e
        with self._lock:
            self._dirty.add(path.parent)

    def flush(self) -> None:
        with self._lock:
            dirty, self._dirty = self._dirty, set()
        # Deepest first, so a new shard directory is durable before its parent's entry. A
        # capture dirties up to 256 shard directories: they are synced together, which lets
        # the filesystem fold them into few journal commits instead of paying one round
        # trip to the disk after another.
        by_depth: dict[int, list[Path]] = {}
        for d in dirty:
            by_depth.setdefault(len(d.parts), []).append(d)
        for depth in sorted(by_depth, reverse=True):
            level = sorted(by_depth[depth])
            try:
                if len(level) == 1:
                    _fsync_dir(level[0])
                else:
                    with Executor(min(16, len(level)), thread_name_prefix="sojourn-fsync") as pool:
                        list(pool.map(_fsync_dir, level))
            except OSError as e:
                with self._lock:  # still not durable: the next flush must try them again
                    self._dirty |= {d for ds in by_depth.values() for d in ds}
                raise os_error(e, "syncing", getattr(e, "filename", None) or self.root) from e


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as e:
        if e.filename is None:
            e.filename = str(path)
        raise
