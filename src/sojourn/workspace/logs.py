"""A workspace's output: one continuous log across every process and machine it ran in.

The supervisor of an allocation reads the session's stdout and stderr pipes and writes what
it reads, byte for byte, into numbered pieces ``log.<ws>.<al>.<seq:06d>`` (a piece every few
seconds, and always before the allocation's ``stopped`` event). A piece is a sequence of
records ``stream (1 byte: o|e) · length (4 bytes, big-endian) · bytes``. The workspace's log
is the pieces of its allocations, in the order the allocations appear in the record.
"""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from sojourn.errors import AlreadyExists, ObjectNotFound
from sojourn.repository.backend import Backend
from sojourn.workspace.errors import WorkspaceError
from sojourn.workspace.records import WorkspaceRecord

KIND = "workspaces"
_HEADER = struct.Struct(">cI")
STREAMS = {"stdout": b"o", "stderr": b"e"}
_NAMES = {v: k for k, v in STREAMS.items()}


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


def encode(records: list[tuple[str, bytes]]) -> bytes:
    out = bytearray()
    for stream, data in records:
        out += _HEADER.pack(STREAMS[stream], len(data))
        out += data
    return bytes(out)


def decode(blob: bytes, what: str) -> Iterator[tuple[str, bytes]]:
    pos = 0
    while pos < len(blob):
        if pos + _HEADER.size > len(blob):
            raise WorkspaceError(f"{what} is truncated; the repository is damaged")
        tag, n = _HEADER.unpack_from(blob, pos)
        pos += _HEADER.size
        if tag not in _NAMES or pos + n > len(blob):
            raise WorkspaceError(f"{what} is damaged (bad record at byte {pos - _HEADER.size})")
        yield _NAMES[tag], blob[pos : pos + n]
        pos += n


class LogWriter:
    """Buffers one allocation's output and writes it as pieces (thread-safe)."""

    def __init__(self, backend: Backend, ws: str, al: str, *, interval: float = 5.0, max_bytes: int = 1 << 20,
                 first_seq: int = 1):
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
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()

    def write(self, stream: str, data: bytes) -> None:
        if not data:
            return
        with self._lock:
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
                self._size = 0
                self._since = None
            if not records:
                return
            blob = encode([(s, bytes(d)) for s, d in records])
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
