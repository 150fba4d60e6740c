"""The write check, rehearsed: would the namespace come back as it is?

A capture can pickle every object and still fail its write check: a library object whose
own pickling drops part of its state, or rebuilds a shared part twice, comes back different
(the fingerprints differ). :func:`rehearse` predicts that without writing a capsule: in a
forked child (the program's memory, copy-on-write; nothing the child does reaches the
program) it pickles the namespace, unpickles it, pickles the result again and compares the
two streams as the restore does, and names the place inside each variable that differs. The
child's output goes to /dev/null and it reopens the program's files for reading only, so
what it rebuilds (a tqdm bar draws itself) reaches neither the terminal nor those files; the
scan before it has flushed the program's file buffers, so the child has nothing to write.

Array and CPU tensor buffers are handed back zero-copy (the restored arrays and storages are
the child's copy-on-write view of the program's memory, so nothing is copied unless written);
other buffers are copied, so a namespace whose other buffers exceed a quarter of the memory
available is not rehearsed (None). What the child cannot tell: differences that only another
process or machine shows (a class found by another name there, another library version);
those the write check still finds.
"""

from __future__ import annotations

import io
import json
import os
import select
import signal
import time
from pathlib import Path
from typing import Any

from sojourn.capsule.pickler import BufferOut, CapsulePickler, CaptureContext

_CHILD_SECONDS = 120.0


def rehearse(roots: dict[str, Any], workspace: Path | None = None,
             timeout: float = _CHILD_SECONDS) -> list[tuple[str, str]] | None:
    """[(variable, "where inside it it differs")] for every variable the write check would
    refuse; None when it could not be rehearsed (no fork, too much memory, the child failed)."""
    child = start(roots, workspace)
    return None if child is None else child.result(timeout)


class Rehearsal:
    """A forked child rehearsing the write check; :meth:`result` waits for its answer."""

    def __init__(self, pid: int, fd: int):
        self.pid = pid
        self.fd = fd

    def result(self, timeout: float = _CHILD_SECONDS) -> list[tuple[str, str]] | None:
        chunks: list[bytes] = []
        deadline = time.monotonic() + timeout
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([self.fd], [], [], left)[0]:
                    os.kill(self.pid, signal.SIGKILL)
                    break
                piece = os.read(self.fd, 1 << 16)
                if not piece:
                    break
                chunks.append(piece)
        finally:
            os.close(self.fd)
            os.waitpid(self.pid, 0)
        try:
            doc = json.loads(b"".join(chunks) or b"{}")
        except ValueError:
            return None
        found = doc.get("found")
        return [(str(a), str(b)) for a, b in found] if isinstance(found, list) else None


def start(roots: dict[str, Any], workspace: Path | None = None) -> Rehearsal | None:
    """Fork the rehearsal; None where this platform cannot fork."""
    if not hasattr(os, "fork") or not roots:
        return None
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        os.close(r)
        for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        # What objects rebuilt here draw or print (a tqdm bar) must not reach the program's
        # terminal or logs.
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        try:
            found = _in_child(roots, workspace or Path.cwd())
            data = json.dumps({"found": found}).encode()
        except BaseException as e:  # whatever happens, the child reports and exits
            data = json.dumps({"error": f"{type(e).__name__}: {e}"}).encode()
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(w, view):]
        finally:
            os._exit(0)
    os.close(w)
    return Rehearsal(pid, r)


def _in_child(roots: dict[str, Any], workspace: Path) -> list[tuple[str, str]] | None:
    from sojourn.capsule import byteorder
    from sojourn.capsule.context import RestoreContext, restoring
    from sojourn.capsule.fingerprint import canonical_digests, difference, hash_pieces
    from sojourn.capsule.registry import allocator

    ctx = CaptureContext(workspace=workspace, namespace=roots)
    sink = io.BytesIO()
    pickler = CapsulePickler(sink, ctx)
    names = list(roots)
    segments: list[tuple[int, int]] = []
    for name in names:
        start = sink.tell()
        pickler.dump(roots[name])
        segments.append((start, sink.tell()))
    if ctx.problems:
        return []  # refused already, by the scan that called us
    copied = sum(b.view.nbytes for b in pickler.buffers if b.kind not in ("ndarray", "torch-storage"))
    if copied > _available() // 4:
        return None
    objects, tokens = [], {}
    for i, b in enumerate(pickler.buffers):
        if b.kind == "ndarray":
            obj, view = _zero_copy(b)
        elif b.kind == "torch-storage" and b.view.nbytes and not b.view.readonly:
            obj, view = _zero_copy_storage(b)
        else:
            obj, view = _copy(b, allocator)
        objects.append(obj)
        tokens[(_address(view), view.nbytes)] = [f"buffer {i}"]
    stream = sink.getvalue()
    restored: dict[str, Any] = {}
    rctx = RestoreContext(namespace=restored, files_to=workspace, restored_buffers=tokens,
                          devices=list(ctx.devices), user_modules=ctx.user_modules, rehearsal=True)
    with restoring(rctx):
        unpickler = byteorder.unpickler(io.BytesIO(stream), iter(objects))
        for name in names:
            restored[name] = unpickler.load()
        again_ctx = CaptureContext(workspace=workspace, namespace=restored, fingerprint_only=True)
        again = io.BytesIO()
        repickler = CapsulePickler(again, again_ctx)
        segs2: list[tuple[int, int]] = []
        for name in names:
            start = again.tell()
            repickler.dump(restored[name])
            segs2.append((start, again.tell()))
    first_hashes = [[f"buffer {i}"] for i in range(len(pickler.buffers))]
    second_hashes = [tokens.get((_address(b.view), b.view.nbytes)) or hash_pieces(b.view) for b in repickler.buffers]
    data2 = again.getvalue()
    differing = {i for i, ((a, b), (c, d)) in enumerate(zip(segments, segs2, strict=True))
                 if stream[a:b] != data2[c:d]}
    if not differing and len(first_hashes) == len(second_hashes):
        return []
    va: dict[int, Any] = {}
    vb: dict[int, Any] = {}
    wanted = differing or set(range(len(names)))
    da = canonical_digests(stream, segments, first_hashes, wanted, values=va)
    db = canonical_digests(data2, segs2, second_hashes, wanted, values=vb)
    return [(names[i], difference(va[i], vb[i])) for i in sorted(wanted) if da[i] != db[i]]


def _address(view: memoryview) -> int:
    import ctypes

    if not view.nbytes:
        return id(view.obj)
    if view.readonly:
        import numpy as np  # a read-only view still says where its bytes are

        return int(np.frombuffer(view, dtype=np.uint8).__array_interface__["data"][0])
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


def _zero_copy(b: BufferOut) -> tuple[Any, memoryview]:
    """The array a restore would allocate, over the program's own memory (the child's copy)."""
    import numpy as np

    from sojourn.capsule.reducers import numpy_order

    meta = b.meta
    dtype = numpy_order.decode_descr(meta["dtype"], meta.get("explicit"))
    view = b.view.cast("B") if b.view.format != "B" or b.view.ndim != 1 else b.view
    if not view.nbytes:
        return np.empty(tuple(meta["shape"]), dtype=dtype, order=meta["order"]), view
    # Over a ctypes window on the same bytes, not the view: the array's base must not be an
    # ndarray (the program's raw byte view), or it would pickle again as a view of that.
    import ctypes

    window = (ctypes.c_char * view.nbytes).from_address(_address(view))
    window._sj_keep = b.owner  # type: ignore[attr-defined]
    arr = np.ndarray(tuple(meta["shape"]), dtype=dtype, buffer=window, order=meta["order"])  # type: ignore[arg-type]
    if view.readonly:
        arr.flags.writeable = False
    return arr, view


def _zero_copy_storage(b: BufferOut) -> tuple[Any, memoryview]:
    """A torch storage over the program's own bytes (the child's copy), as the allocator's."""
    import ctypes

    import torch

    view = b.view.cast("B") if b.view.format != "B" or b.view.ndim != 1 else b.view
    window = (ctypes.c_char * view.nbytes).from_address(_address(view))
    window._sj_keep = b.owner  # type: ignore[attr-defined]
    storage = torch.frombuffer(window, dtype=torch.uint8).untyped_storage()
    return storage, view


def _copy(b: BufferOut, allocator: Any) -> tuple[Any, memoryview]:
    if b.kind == "raw":
        out = bytearray(b.view.cast("B") if b.view.ndim != 1 or b.view.format != "B" else b.view)
        return out, memoryview(out)
    obj, view = allocator(b.kind)(b.meta, b.view.nbytes)
    view[:] = b.view.cast("B") if b.view.ndim != 1 or b.view.format != "B" else b.view
    return obj, view


def _available() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 62
