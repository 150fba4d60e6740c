"""A workspace's output: one continuous log across every process and machine it ran in.

The session process writes its stdout and stderr into two files on its machine,
``$SOJOURN_HOME/output/<ws>.<al>.out`` and ``.err`` (its supervisor creates them and passes
them as the session's fds 1 and 2): every byte the program, or a subprocess of it, writes is
in the kernel's file the moment ``write(2)`` returns, whoever dies next. The supervisor tails
the two files and writes what it reads, byte for byte, into numbered pieces
``log.<ws>.<al>.<seq:06d>`` (a piece every few seconds, and always before the allocation's
``stopped`` event). A piece is a sequence of records ``tag (1 byte) · length (4 bytes,
big-endian) · bytes``: ``o`` and ``e`` hold stdout and stderr bytes; ``p`` (first in every
piece written since the files) holds the two file offsets the piece ends at, so that whoever
logs an allocation whose supervisor died (its orphaned session, a reaper) appends exactly
``file[end:]`` of each file (:func:`log_rest`): nothing lost, nothing twice. Readers skip
``p``; pieces without it (written before) read as they always did. The workspace's log is the
pieces of its allocations, in the order the allocations appear in the record.
"""

from __future__ import annotations

import os
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sojourn.errors import AlreadyExists, ObjectNotFound
from sojourn.repository.backend import Backend
from sojourn.repository.repo import sojourn_home
from sojourn.workspace.errors import WorkspaceError
from sojourn.workspace.records import WorkspaceRecord

KIND = "workspaces"
_HEADER = struct.Struct(">cI")
STREAMS = {"stdout": b"o", "stderr": b"e"}
_NAMES = {v: k for k, v in STREAMS.items()}
_ENDS_TAG = b"p"
_ENDS = struct.Struct(">QQ")  # stdout's and stderr's file offsets a piece ends at
Ends = tuple[int, int]


@dataclass
class LogRecord:
    allocation: str
    stream: str  # "stdout" or "stderr"
    data: bytes

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")


def piece_name(ws: str, al: str, seq: int) -> str:
    return f"log.{ws}.{al}.{seq:06d}"


def encode(records: list[tuple[str, bytes]], ends: Ends | None = None) -> bytes:
    out = bytearray()
    if ends is not None:
        out += _HEADER.pack(_ENDS_TAG, _ENDS.size) + _ENDS.pack(*ends)
    for stream, data in records:
        out += _HEADER.pack(STREAMS[stream], len(data))
        out += data
    return bytes(out)


def _records(blob: bytes, what: str) -> Iterator[tuple[bytes, bytes]]:
    pos = 0
    while pos < len(blob):
        if pos + _HEADER.size > len(blob):
            raise WorkspaceError(f"{what} is truncated; the repository is damaged")
        tag, n = _HEADER.unpack_from(blob, pos)
        pos += _HEADER.size
        if (tag not in _NAMES and tag != _ENDS_TAG) or pos + n > len(blob):
            raise WorkspaceError(f"{what} is damaged (bad record at byte {pos - _HEADER.size})")
        yield tag, blob[pos : pos + n]
        pos += n


def decode(blob: bytes, what: str) -> Iterator[tuple[str, bytes]]:
    """The piece's output records (stream, bytes); its file offsets are skipped."""
    for tag, data in _records(blob, what):
        if tag != _ENDS_TAG:
            yield _NAMES[tag], data


def piece_ends(blob: bytes, what: str) -> Ends | None:
    """The (stdout, stderr) file offsets the piece ends at; None for a piece without them."""
    for tag, data in _records(blob, what):
        if tag == _ENDS_TAG:
            if len(data) != _ENDS.size:
                raise WorkspaceError(f"{what} is damaged (its file offsets are {len(data)} bytes)")
            out, err = _ENDS.unpack(data)
            return int(out), int(err)
    return None


class LogWriter:
    """Buffers one allocation's output and writes it as pieces (thread-safe).

    With ``ends`` (the output files' offsets where this writer starts), each :meth:`write`
    says the offset its bytes end at in their file, and every piece records the offsets it
    ends at (see the module's docstring)."""

    def __init__(self, backend: Backend, ws: str, al: str, *, interval: float = 5.0, max_bytes: int = 1 << 20,
                 first_seq: int = 1, ends: Ends | None = None):
        self.backend = backend
        self.ws = ws
        self.al = al
        self.interval = interval
        self.max_bytes = max_bytes
        self.seq = first_seq
        self.bytes_written = 0
        self._records: list[tuple[str, bytearray]] = []
        self._size = 0
        self._since: float | None = None
        self._ends = {"stdout": ends[0], "stderr": ends[1]} if ends is not None else None
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()

    def write(self, stream: str, data: bytes, end: int | None = None) -> None:
        if not data:
            return
        with self._lock:
            if self._ends is not None:
                assert end is not None, "a writer that records file offsets needs each write's"
                self._ends[stream] = end
            if self._records and self._records[-1][0] == stream:
                self._records[-1][1].extend(data)
            else:
                self._records.append((stream, bytearray(data)))
            self._size += len(data)
            if self._since is None:
                self._since = time.monotonic()
            full = self._size >= self.max_bytes
        if full:
            self.flush()

    def due(self) -> bool:
        since = self._since
        return since is not None and time.monotonic() - since >= self.interval

    def flush(self) -> None:
        with self._write_lock:  # pieces keep the order their bytes were read in
            with self._lock:
                records, self._records = self._records, []
                ends = (self._ends["stdout"], self._ends["stderr"]) if self._ends is not None else None
                self._size = 0
                self._since = None
            if not records:
                return
            blob = encode([(s, bytes(d)) for s, d in records], ends)
            while True:
                try:
                    self.backend.save(KIND, piece_name(self.ws, self.al, self.seq), blob, exclusive=True)
                    break
                except AlreadyExists:
                    self.seq += 1  # another writer of this allocation (an orphaned session) took it
            self.seq += 1
            self.bytes_written += sum(len(d) for _, d in records)
        self.backend.flush()


def next_free_seq(backend: Backend, ws: str, al: str) -> int:
    names = list(backend.list(KIND, f"log.{ws}.{al}."))
    return 1 + max((int(n.rsplit(".", 1)[1]) for n in names), default=0)


def output_base(ws: str, al: str) -> str:
    """Where an allocation's session writes its stdout and stderr (``.out``, ``.err``): on its
    machine, outside any directory whose files travel (``$SOJOURN_HOME`` is refused as part
    of one). The ``started`` event records it (``Allocation.output``), so that a reaper whose
    ``$SOJOURN_HOME`` differs finds the files too."""
    return str(sojourn_home() / "output" / f"{ws}.{al}")


def output_paths(ws: str, al: str, base: str | None = None) -> tuple[Path, Path]:
    base = base or output_base(ws, al)
    return Path(base + ".out"), Path(base + ".err")


def remove_output(ws: str, al: str, base: str | None = None) -> None:
    for path in output_paths(ws, al, base):
        try:
            path.unlink()
        except FileNotFoundError:
            pass


def logged_ends(backend: Backend, ws: str, al: str) -> Ends:
    """Where the allocation's pieces end in its output files: the offsets of its newest piece
    that records them (pieces are written in order by one writer at a time: the supervisor,
    then, once it is gone, whoever logs the rest), (0, 0) when none does."""
    for name in sorted(backend.list(KIND, f"log.{ws}.{al}."), reverse=True):
        try:
            ends = piece_ends(backend.load(KIND, name), f"log piece {name}")
        except ObjectNotFound:
            continue
        if ends is not None:
            return ends
    return 0, 0


def log_rest(backend: Backend, ws: str, al: str, *, base: str | None = None, remove: bool = True) -> int:
    """Append what the allocation's output files hold beyond its pieces as its last pieces
    (stdout's rest, then stderr's), then remove the files; the number of bytes logged.

    Only for an allocation whose supervisor is gone (no one else writes its pieces): called
    by its orphaned session and by the reaper that records its end. Nothing when the files
    are not on this machine. ``base``: where they are (default: under this ``$SOJOURN_HOME``)."""
    paths = output_paths(ws, al, base)
    if not any(p.exists() for p in paths):
        return 0
    ends = logged_ends(backend, ws, al)
    log = LogWriter(backend, ws, al, first_seq=next_free_seq(backend, ws, al), ends=ends)
    for stream, path, start in zip(("stdout", "stderr"), paths, ends, strict=True):
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            pos = os.lseek(fd, start, os.SEEK_SET)
            while chunk := os.read(fd, 1 << 20):
                pos += len(chunk)
                log.write(stream, chunk, end=pos)
        finally:
            os.close(fd)
    log.flush()
    if remove:
        remove_output(ws, al, base)
    return log.bytes_written


def allocation_records(backend: Backend, ws: str, al: str, after: int = 0) -> Iterator[tuple[int, LogRecord]]:
    """The records of one allocation's pieces numbered above ``after``, with their piece number."""
    for name in sorted(backend.list(KIND, f"log.{ws}.{al}.")):
        seq = int(name.rsplit(".", 1)[1])
        if seq <= after:
            continue
        try:
            blob = backend.load(KIND, name)
        except ObjectNotFound:
            continue
        for stream, data in decode(blob, f"log piece {name}"):
            yield seq, LogRecord(al, stream, data)


def read_log(backend: Backend, rec: WorkspaceRecord) -> list[LogRecord]:
    """The workspace's whole log, allocation after allocation."""
    out: list[LogRecord] = []
    for a in rec.allocations:
        out.extend(r for _, r in allocation_records(backend, rec.id, a.id))
    return out
