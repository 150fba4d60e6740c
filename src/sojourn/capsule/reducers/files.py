"""Open files: a path inside the workspace, a mode and a position, reopened at restore.

A file object is a stack: ``FileIO`` (the descriptor) under an optional ``Buffered*`` under
an optional ``TextIOWrapper``. Each layer has its own reducer and takes the layer below as
an argument, so that a variable holding ``f.buffer`` next to ``f`` is still the same object
after restore. What travels:

* ``FileIO``: the path relative to the workspace root (``pickler.ctx.workspace``), its mode
  and offset. It is reopened under ``RestoreContext.files_to``, where the workspace files
  were written before anything was unpickled. A file opened with "w" or "x" is reopened
  *without* truncation (descriptor opened without ``O_TRUNC``/``O_EXCL``, then wrapped by
  ``FileIO(fd, "wb")``, so ``mode`` still says "wb"); "a" keeps ``O_APPEND``.
* ``Buffered*``: its type and position; writers are flushed first, so that the bytes
  written so far are in the file when the workspace snapshot reads it (capture pickles
  before it snapshots).
* ``TextIOWrapper``: encoding, errors, newline, line buffering, write-through, the ``mode``
  that ``open()`` gave it, and its ``tell()`` cookie (which includes the decoder state,
  so a multibyte or universal-newline position comes back exactly).

Files outside the workspace, pipes, sockets and devices cannot travel and are reported as
problems; ``os.devnull`` travels as the destination's. ``sys.stdout`` & co. travel as the
destination's own streams. A closed file travels as a closed file of the same type.

Fingerprints: the text layer's cookie is a fixpoint (seek(cookie) then tell() gives the
cookie back). The lower layers' offsets are not: the text layer reads ahead, so the raw
offset at capture includes read-ahead that a reopened stack does not repeat. A reopened
``FileIO``/``Buffered*`` therefore remembers the offset it was rebuilt with, and the
fingerprint pass (and only it) reports that offset.
"""

from __future__ import annotations

import gc
import io
import os
import stat
import sys
import weakref
from pathlib import Path, PurePosixPath
from typing import Any

from sojourn.capsule.context import current
from sojourn.capsule.reducers.stdlib import std_stream_reduce
from sojourn.capsule.registry import register, type_name
from sojourn.capsule.workspace_files import inside, is_skipped
from sojourn.errors import RestoreError

_BINARY = getattr(os, "O_BINARY", 0)
# FileIO.mode -> flags that reopen the same file the same way, never truncating or failing
# because it exists.
_RAW_FLAGS = {
    "rb": os.O_RDONLY,
    "rb+": os.O_RDWR,
    "wb": os.O_WRONLY,
    "xb": os.O_WRONLY,
    "xb+": os.O_RDWR,
    "ab": os.O_WRONLY | os.O_APPEND,
    "ab+": os.O_RDWR | os.O_APPEND,
}
_BUFFERED: dict[str, type] = {
    "_io.BufferedReader": io.BufferedReader,
    "_io.BufferedWriter": io.BufferedWriter,
    "_io.BufferedRandom": io.BufferedRandom,
}
_NEWLINES = ("", "\n", "\r", "\r\n")

# Offsets that reopened lower layers were rebuilt with (see the module docstring).
_REBUILT_AT: weakref.WeakKeyDictionary[Any, int | None] = weakref.WeakKeyDictionary()


# -- where a descriptor points -------------------------------------------------------------


def _fd_path(fd: int, name: Any) -> Path | None:
    proc = f"/proc/self/fd/{fd}"
    if os.path.islink(proc):
        return Path(os.readlink(proc))
    try:
        import fcntl

        if hasattr(fcntl, "F_GETPATH"):  # macOS
            raw = fcntl.fcntl(fd, fcntl.F_GETPATH, bytes(1024))
            return Path(os.fsdecode(raw.split(b"\0", 1)[0]))
    except (ImportError, OSError):
        pass
    if isinstance(name, str | bytes):
        return Path(os.path.abspath(os.fsdecode(name))).resolve()
    return None


def _is_devnull(st: os.stat_result) -> bool:
    try:
        null = os.stat(os.devnull)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == (null.st_dev, null.st_ino)


def _locate(raw: io.FileIO, pickler: Any) -> str | PurePosixPath | None:
    """The workspace-relative path of ``raw``'s file, None for os.devnull, or why it cannot
    travel (a string)."""
    fd = raw.fileno()
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        if stat.S_ISCHR(st.st_mode) and _is_devnull(st):
            return None
        kind = (
            "a pipe" if stat.S_ISFIFO(st.st_mode)
            else "a socket" if stat.S_ISSOCK(st.st_mode)
            else "a terminal or device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)
            else "not a regular file"
        )
        return (
            f"{_describe(raw)} is {kind}, which belongs to this process and machine; close it "
            "before the capture and open it again after resume"
        )
    if st.st_nlink == 0:
        return f"{_describe(raw)} was deleted while open, so its content is not in the workspace; close it"
    path = _fd_path(fd, raw.name)
    workspace = (pickler.ctx.workspace or Path.cwd()).resolve()
    if path is None:
        return f"{_describe(raw)}: its location cannot be found; close it before the capture"
    try:
        rel = PurePosixPath(path.relative_to(workspace).as_posix())
    except ValueError:
        return f"file outside the workspace: {path}; move it into the workspace or close it"
    if is_skipped(rel):
        return (
            f"file {path} is in a part of the workspace that captures leave out (.git, .venv*, "
            "__pycache__, *.pyc); move it elsewhere in the workspace or close it"
        )
    return rel


def _describe(raw: Any) -> str:
    name = getattr(raw, "name", None)
    return f"file {name!r}" if name is not None else "the file"


def _offset(obj: Any, pickler: Any) -> int | None:
    if pickler.ctx.fingerprint_only:
        try:
            return _REBUILT_AT[obj]
        except KeyError:
            pass
    return obj.tell() if obj.seekable() else None


# -- the standard streams and their lower layers -------------------------------------------


def _std_part(name: str, attrs: tuple[str, ...]) -> Any:
    for stream in (getattr(sys, name, None), getattr(sys, f"__{name}__", None)):
        obj = stream
        try:
            for attr in attrs:
                obj = getattr(obj, attr)
        except AttributeError:
            continue
        if obj is not None:
            return obj
    raise RestoreError(f"this process has no sys.{name}.{'.'.join(attrs)} to stand in for the captured one")


def _std_reduce(obj: Any) -> Any:
    for name in ("stdout", "stderr", "stdin"):
        for stream in (getattr(sys, name, None), getattr(sys, f"__{name}__", None)):
            buffer = getattr(stream, "buffer", None)
            if buffer is obj:
                return (_std_part, (name, ("buffer",)))
            if buffer is not None and getattr(buffer, "raw", None) is obj:
                return (_std_part, (name, ("buffer", "raw")))
    return None


# -- reducers ---------------------------------------------------------------------------------


@register("_io.FileIO")
def _fileio_reduce(obj: io.FileIO, pickler: Any) -> Any:
    std = _std_reduce(obj)
    if std is not None:
        return std
    if obj.closed:
        return (_closed_file, ("_io.FileIO", obj.mode, getattr(obj, "name", None), None))
    where = _locate(obj, pickler)
    if isinstance(where, str):
        return pickler.problem(obj, where)
    if where is None:
        return (_reopen_devnull, (obj.mode,))
    return (_reopen_raw, (where.as_posix(), obj.mode, _offset(obj, pickler)))


@register("_io.BufferedReader", "_io.BufferedWriter", "_io.BufferedRandom")
def _buffered_reduce(obj: Any, pickler: Any) -> Any:
    std = _std_reduce(obj)
    if std is not None:
        return std
    kind = type_name(type(obj))
    try:
        raw = obj.raw
        closed = obj.closed
    except ValueError:
        return pickler.problem(obj, "a buffered file whose raw stream was detached cannot travel")
    if closed:
        return (_closed_file, (kind, _raw_mode(raw), getattr(raw, "name", None), None))
    problem = _check_raw(obj, raw, pickler)
    if problem is not None:
        return problem
    flush_problem = _flush(obj, pickler)
    if flush_problem is not None:
        return flush_problem
    if type(raw) is io.BytesIO:
        # Its own pickled position includes this layer's read-ahead, which a rebuilt stack
        # does not repeat: it travels as its bytes (a separate reference to it stays separate).
        return (_rebuffer_bytes, (kind, raw.getvalue(), _offset(obj, pickler)))
    return (_rebuffer, (kind, raw, _offset(obj, pickler)))


@register("_io.TextIOWrapper")
def _text_reduce(obj: io.TextIOWrapper, pickler: Any) -> Any:
    std = std_stream_reduce(obj)
    if std is not None:
        return std
    try:
        buffer = obj.buffer
        closed = obj.closed
    except ValueError:
        return pickler.problem(obj, "a text file whose buffer was detached cannot travel")
    mode = getattr(obj, "mode", None)
    if closed:
        kind = type_name(type(buffer))
        kind = kind if kind in _BUFFERED else "_io.BufferedRandom"
        raw = getattr(buffer, "raw", None)
        text = (obj.encoding, obj.errors, mode if isinstance(mode, str) else None)
        return (_closed_file, (kind, _raw_mode(raw), getattr(raw, "name", None), text))
    problem = _check_raw(obj, getattr(buffer, "raw", None), pickler)
    if problem is not None:
        return problem
    flush_problem = _flush(obj, pickler)
    if flush_problem is not None:
        return flush_problem
    cookie = None
    # Over the standard streams the destination's own position is the right one.
    if obj.seekable() and _std_reduce(buffer) is None:
        try:
            cookie = _text_position(obj)
        except (OSError, ValueError) as e:
            name = getattr(obj, "name", "?")
            return pickler.problem(obj, f"the position of text file {name!r} cannot be read ({e})")
    options = (obj.encoding, obj.errors, _newline(obj), obj.line_buffering, obj.write_through,
               mode if isinstance(mode, str) else None, cookie)
    if type(buffer) is io.BytesIO:  # as in _buffered_reduce
        return (_rewrap_bytes, (buffer.getvalue(), *options))
    return (_rewrap, (buffer, *options))


def _flush(obj: Any, pickler: Any) -> Any:
    """Flush a writer so that its bytes are in the file the snapshot reads next."""
    if not obj.writable():
        return None
    try:
        obj.flush()
    except OSError as e:
        return pickler.problem(obj, f"flushing {_describe(obj)} failed ({e}); its data would be lost")
    return None


def _check_raw(obj: Any, raw: Any, pickler: Any) -> Any:
    """A problem placeholder for ``obj`` when the file under it cannot travel, else None.

    Checked at the outermost layer, so that the error names the object the user holds.
    """
    if isinstance(raw, io.FileIO):
        if raw.closed or _std_reduce(raw) is not None:
            return None
        where = _locate(raw, pickler)
        if isinstance(where, str):
            return pickler.problem(obj, where)
    elif type(raw).__name__ == "SocketIO":
        return pickler.problem(
            obj, "a socket opened as a file (socket.makefile) is tied to this process's "
            "connection; close it and reconnect after resume"
        )
    return None


def _raw_mode(raw: Any) -> str:
    mode = getattr(raw, "mode", None)
    return mode if mode in _RAW_FLAGS else "rb+"


def _text_position(f: io.TextIOWrapper) -> int:
    try:
        return f.tell()
    except OSError:
        if not f.readable():
            raise
    # Iterating a text file (``for line in f``) disables tell() until the loop ends; the
    # position is then recovered by counting the characters left, and the file is moved to
    # the same place by a route that leaves tell() enabled (seek(0) and read). This reads
    # the file, which costs time only for a file paused in the middle of such a loop.
    left = _count_chars(f)
    f.seek(0)
    total = _count_chars(f)
    f.seek(0)
    todo = total - left
    while todo:
        got = len(f.read(min(todo, 1 << 20)))
        if not got:
            raise OSError("the file changed while its position was being recovered")
        todo -= got
    return f.tell()


def _count_chars(f: io.TextIOWrapper) -> int:
    n = 0
    while block := f.read(1 << 20):
        n += len(block)
    return n


def _newline(f: io.TextIOWrapper) -> str | None:
    """The ``newline`` argument the wrapper was created with.

    TextIOWrapper does not expose it. CPython's wrapper visits, for the garbage collector and
    in this order: buffer, encoding, encoder, decoder, readnl (the newline argument, absent
    for None), decoded_chars, pending_bytes, snapshot, errors, raw, dict. ``encoding`` and
    ``errors`` are the very objects the attributes return, so the strings between them are
    readnl and/or the decoded read-ahead; the decoder's type and a no-op seek settle which.
    """
    strings, decoder = _between_encoding_and_errors(f)
    if decoder is None:  # write-only: nothing was ever decoded, so a string is readnl
        return strings[0] if strings and strings[0] in _NEWLINES else None
    if type(decoder).__name__ != "IncrementalNewlineDecoder":
        # Only "\n", "\r" and "\r\n" read without universal newlines.
        return strings[0] if strings and strings[0] in _NEWLINES[1:] else None
    if not strings or strings[0] != "":
        return None
    if len(strings) >= 2:
        return ""
    # One empty string: readnl "" or an empty read-ahead; a seek to the current position
    # drops the read-ahead.
    f.seek(f.tell())
    strings, _ = _between_encoding_and_errors(f)
    return "" if strings and strings[0] == "" else None


def _between_encoding_and_errors(f: io.TextIOWrapper) -> tuple[list[str], Any]:
    refs = [r for r in gc.get_referents(f) if not isinstance(r, type)]
    encoding, errors = f.encoding, f.errors
    start = next((i for i, r in enumerate(refs) if r is encoding), None)
    if start is None:
        return [], None
    strings: list[str] = []
    decoder = None
    for r in refs[start + 1 :]:
        if r is errors:
            break
        if isinstance(r, str):
            strings.append(r)
        elif type(r).__name__.endswith("Decoder"):
            decoder = r
    return strings, decoder


# -- reconstructors ------------------------------------------------------------------------------


def _reopen_raw(rel: str, mode: str, offset: int | None) -> io.FileIO:
    ctx = current()
    path = inside(ctx.files_to, rel)
    flags = _RAW_FLAGS.get(mode)
    if flags is None:
        raise RestoreError(f"open file {rel!r} has mode {mode!r}, which this sojourn cannot reopen")
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise RestoreError(
            f"the open file {rel!r} is not in {ctx.files_to}: capture with files=<workspace> so "
            "that the workspace files travel with the capsule, or restore with files_to= the "
            "directory that holds them"
        ) from None
    if not stat.S_ISREG(st.st_mode):
        raise RestoreError(f"{path} is not a regular file, so the open file {rel!r} cannot be reopened there")
    fd = os.open(path, (os.O_RDONLY if ctx.rehearsal else flags) | _BINARY)
    try:
        raw = io.FileIO(fd, mode, closefd=True)
    except BaseException:
        os.close(fd)
        raise
    raw.name = str(path)  # type: ignore[misc]  # FileIO keeps name in its __dict__
    if offset is not None:
        raw.seek(offset)
    _REBUILT_AT[raw] = offset
    return raw


def _reopen_devnull(mode: str) -> io.FileIO:
    fd = os.open(os.devnull, os.O_RDWR | _BINARY)
    raw = io.FileIO(fd, mode if mode in _RAW_FLAGS else "rb+", closefd=True)
    raw.name = os.devnull  # type: ignore[misc]
    return raw


def _rebuffer(kind: str, raw: Any, offset: int | None) -> Any:
    buffered = _BUFFERED[kind](raw)
    if offset is not None:
        buffered.seek(offset)
    _REBUILT_AT[buffered] = offset
    return buffered


def _rebuffer_bytes(kind: str, data: bytes, offset: int | None) -> Any:
    return _rebuffer(kind, io.BytesIO(data), offset)


def _rewrap_bytes(data: bytes, *options: Any) -> io.TextIOWrapper:
    return _rewrap(io.BytesIO(data), *options)


def _rewrap(
    buffer: Any,
    encoding: str,
    errors: str,
    newline: str | None,
    line_buffering: bool,
    write_through: bool,
    mode: str | None,
    cookie: int | None,
) -> io.TextIOWrapper:
    text = io.TextIOWrapper(
        buffer, encoding=encoding, errors=errors, newline=newline,
        line_buffering=line_buffering, write_through=write_through,
    )
    if mode is not None:
        text.mode = mode  # type: ignore[misc]  # as open() does
    if cookie is not None:
        text.seek(cookie)
    return text


def _closed_file(kind: str, raw_mode: str, name: Any, text: tuple[str, str, str | None] | None) -> Any:
    """A closed file object of the same type, mode and name (over os.devnull, then closed)."""
    fd = os.open(os.devnull, os.O_RDWR | _BINARY)
    raw = io.FileIO(fd, raw_mode if raw_mode in _RAW_FLAGS else "rb+", closefd=True)
    raw.name = name  # type: ignore[misc]
    obj: Any = raw if kind == "_io.FileIO" else _BUFFERED.get(kind, io.BufferedRandom)(raw)
    if text is not None:
        encoding, errors, mode = text
        obj = io.TextIOWrapper(obj, encoding=encoding, errors=errors)
        if mode is not None:
            obj.mode = mode
    obj.close()
    return obj
