"""Restore: check everything, then allocate, read, unpickle, and check the fingerprints.

Unpickling runs code, so nothing is unpickled until the manifest's signature and every
chunk's hash have been checked. The order:

1. open the manifest (format, version, id, signature);
2. materialise the workspace files under ``files_to`` (small files first);
3. allocate every out-of-band buffer as its final object (an owning array of the right
   dtype and shape) and read its chunks straight into it, checking each chunk's hash;
4. unpickle the variables in order into the target namespace, then the process segment
   (RNG states);
5. pickle the restored variables again and compare fingerprints; a mismatch refuses the
   restore and names the variable.
"""

from __future__ import annotations

import gc
import io
import json
import os
import pickle
import re
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sojourn.capsule import (
    byteorder,
    reducers,  # noqa: F401  (registers every reducer)
)
from sojourn.capsule import format as fmt
from sojourn.capsule.context import RestoreContext, restoring
from sojourn.capsule.environment import check_distributions, refuse_missing
from sojourn.capsule.fingerprint import (
    canonical_digests,
    difference,
    extern_token,
    hash_pieces,
    segment_fingerprint,
)
from sojourn.capsule.pickler import (
    BufferOut,
    CapsulePickler,
    CaptureContext,
    DeepCapsulePickler,
    deeply,
)
from sojourn.capsule.reducers.matplotlib import apply_pyplot_state
from sojourn.capsule.reducers.numpy import small_pages
from sojourn.capsule.reducers.rng import apply_process_state
from sojourn.capsule.registry import allocator
from sojourn.errors import IntegrityError, ObjectNotFound, RestoreError
from sojourn.repository.chunks import BufferRecord
from sojourn.repository.repo import Repository


class Restored(dict[str, Any]):
    """The restored namespace, with what happened on the way."""

    manifest: fmt.Manifest
    timings: dict[str, float]
    notes: list[str]
    process: dict[str, Any]  # the process segment: RNG states and what capture(extra=) added


def _allocate(buf: fmt.Buffer) -> tuple[Any, memoryview]:
    if buf.kind == "raw":
        out = bytearray(buf.record.size)
        return out, memoryview(out)
    try:
        alloc = allocator(buf.kind)
    except KeyError:
        raise RestoreError(f"the capsule holds a buffer of kind {buf.kind!r} that this sojourn cannot rebuild") from None
    return alloc(buf.meta, buf.record.size)


Reuse = Callable[[fmt.Manifest], list[tuple[Any, memoryview, list[tuple[BufferRecord, memoryview]]] | None]]


def read_all(repo: Repository, manifest: fmt.Manifest,
             reuse: Reuse | None = None) -> tuple[bytes, list[Any], dict[tuple[int, int], list[str]]]:
    """Read and check every chunk of the capsule; nothing is unpickled here.

    ``reuse`` (a move's destination, notebook/prefetch.py) gives, per buffer, an object it
    already filled with hash-checked chunks of an earlier capsule, with the chunks still to
    read into it; or None: allocate and read as usual."""
    objects: list[Any] = []
    pairs: list[tuple[BufferRecord, memoryview]] = []
    known: dict[tuple[int, int], list[str]] = {}
    held = reuse(manifest) if reuse is not None else [None] * len(manifest.buffers)
    with small_pages(any(b.kind == "ndarray" for b in manifest.buffers)):
        for buf, got in zip(manifest.buffers, held, strict=True):
            if got is None:
                obj, view = _allocate(buf)
                pairs.append((buf.record, view))
            else:
                obj, view, pending = got
                pairs.extend(pending)
            objects.append(obj)
            if len(view):
                known[(_address(view), len(view))] = buf.record.chunks
    try:
        stream = bytes(repo.chunks.get(manifest.stream))
        repo.chunks.get_many(pairs)
    except ObjectNotFound as e:
        raise IntegrityError(f"capsule {manifest.id} cannot be restored: {e}. Nothing was unpickled.") from None
    except IntegrityError as e:
        raise IntegrityError(f"capsule {manifest.id} cannot be restored: {e}. Nothing was unpickled.") from None
    return stream, objects, known


def _address(view: memoryview) -> int:
    import ctypes

    if view.readonly:
        return id(view.obj)
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


def restore_capsule(
    repo: Repository,
    capsule: str,
    *,
    files_to: str | os.PathLike[str] = ".",
    device_policy: str = "auto",
    into: dict[str, Any] | None = None,
    check: bool = True,
    reuse: Reuse | None = None,
) -> Restored:
    t0 = time.perf_counter()
    manifest = fmt.load_manifest(repo, capsule)
    fmt.check_readable(manifest)
    refuse_missing(manifest)
    notes = check_distributions(manifest.distributions, manifest.environment)
    files_root = Path(files_to).absolute()
    if manifest.files:
        from sojourn.capsule.workspace_files import materialize

        materialize(manifest.files, repo.chunks, files_root)
    t_files = time.perf_counter()
    stream, objects, known = read_all(repo, manifest, reuse)
    t_read = time.perf_counter()

    # Restored functions use this very dict as their globals: return it, never a copy.
    namespace: dict[str, Any] = into if into is not None else Restored()
    ctx = RestoreContext(
        namespace=namespace,
        files_to=files_root,
        device_policy=device_policy,
        devices=list(manifest.devices),
        user_modules=manifest.user_modules,
        restored_buffers=known,
    )
    if str(files_root) not in sys.path:
        sys.path.insert(0, str(files_root))
    process_state: dict[str, Any] = {}
    with restoring(ctx), _no_gc():
        feed = _Feed(stream)
        unpickler = byteorder.unpickler(feed, iter(objects))
        memo = _Memo(unpickler, feed)
        bases: list[int] = []
        for var in manifest.variables:
            if check:
                bases.append(memo.size())
            try:
                value = unpickler.load()
            except Exception as e:
                raise RestoreError(
                    f"variable {var.name!r} ({var.type}) of capsule {manifest.id} could not be "
                    f"rebuilt: {type(e).__name__}: {e}"
                ) from e
            if var.name == fmt.PROCESS_SEGMENT:
                process_state = value
            else:
                namespace[var.name] = value
        t_load = time.perf_counter()
        if check:
            try:
                check_fingerprints(manifest, namespace, process_state, ctx, stream, memo, bases)
            except RecursionError:  # nested deeper than this stack: where there is a stack for it
                try:
                    deeply(check_fingerprints, manifest, namespace, process_state, ctx, stream, memo, bases,
                           deep=True)
                except RecursionError:
                    raise RestoreError(
                        f"capsule {manifest.id} holds objects nested deeper than sojourn can pickle "
                        "again on this machine to check them (or whose pickling calls itself without "
                        "end); restore it where it was captured, or flatten the structure before "
                        "capturing") from None
        t_check = time.perf_counter()
    apply_process_state(process_state)
    try:
        notes = [*notes, *apply_pyplot_state(process_state)]
    except Exception as e:  # the figures are restored; only pyplot's list of them is not
        notes = [*notes, f"pyplot's figures are restored but not registered with pyplot again "
                         f"({type(e).__name__}: {e}): plt.gcf() and figure numbers start afresh"]
    t_end = time.perf_counter()
    out = namespace if isinstance(namespace, Restored) else Restored()
    out.manifest = manifest
    out.process = process_state
    out.notes = notes + ctx.warnings
    out.timings = {
        "files": t_files - t0,
        "read": t_read - t_files,
        "unpickle": t_load - t_read,
        "fingerprints": t_check - t_load,
        "process": t_end - t_check,
        "total": t_end - t0,
    }
    if into is not None:
        out.update({v.name: namespace[v.name] for v in manifest.variables if v.name in namespace})
    return out


@contextmanager
def _no_gc() -> Iterator[None]:
    # Unpickling and pickling again make or visit every object of the namespace; the cyclic
    # collector, triggered by those allocations, would walk all of them again and again
    # (a third of the fingerprint check's time on 10^5 small objects). Nothing made here
    # is garbage until the restore is over.
    #
    # Everything made meanwhile sits in the youngest generation, so the first collection after
    # re-enabling would traverse all of it at once (50 ms for 10^5 small objects plus a model).
    # freeze() + unfreeze() moves every tracked object into the oldest generation in O(1):
    # the restored objects are long-lived by nature, and a full collection still looks at
    # them (and at any cycle among them the program later drops) as it would have anyway.
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.unfreeze()
        if enabled:
            gc.enable()


class _Feed:
    """The stream as the unpickler reads it, with room to slip in a probe between loads."""

    def __init__(self, data: bytes):
        self.data = memoryview(data)
        self.pos = 0
        self.saved: tuple[memoryview, int] | None = None

    def read(self, n: int = -1) -> bytes:
        end = len(self.data) if n < 0 else min(len(self.data), self.pos + n)
        out = self.data[self.pos : end].tobytes()
        self.pos = end
        return out

    def readinto(self, b: Any) -> int:
        view = memoryview(b).cast("B")
        n = min(len(view), len(self.data) - self.pos)
        view[:n] = self.data[self.pos : self.pos + n]
        self.pos += n
        return n

    def readline(self) -> bytes:
        end = self.data.obj.find(b"\n", self.pos) if isinstance(self.data.obj, bytes) else -1  # type: ignore[union-attr]
        return self.read(-1 if end < 0 else end + 1 - self.pos)


class _Memo:
    """Reads the unpickler's memo one entry at a time, without copying it.

    The C unpickler does not tell how many entries its memo holds, and copying the memo
    costs its size; a tiny pickle that only fetches entry ``k`` (``LONG_BINGET k``), fed to
    the same unpickler between two variables, answers "is there an entry ``k``, and what
    is it" in microseconds.
    """

    def __init__(self, unpickler: pickle.Unpickler, feed: _Feed):
        self.unpickler = unpickler
        self.feed = feed
        self.known = 0  # entries [0, known) exist

    def get(self, k: int) -> tuple[bool, Any]:
        feed = self.feed
        data, pos = feed.data, feed.pos
        feed.data, feed.pos = memoryview(b"\x80\x05j" + k.to_bytes(4, "little") + b"."), 0
        try:
            return True, self.unpickler.load()
        except (KeyError, pickle.UnpicklingError):
            return False, None
        finally:
            feed.data, feed.pos = data, pos

    def size(self) -> int:
        lo, step = self.known, 1  # entry lo-1 exists (or lo == 0); find the first missing
        while self.get(lo + step - 1)[0]:
            lo, step = lo + step, step * 2
        hi = lo + step - 1  # entry hi is missing
        while lo < hi:
            mid = (lo + hi) // 2
            if self.get(mid)[0]:
                lo = mid + 1
            else:
                hi = mid
        self.known = lo
        return lo


def check_fingerprints(
    manifest: fmt.Manifest,
    namespace: dict[str, Any],
    process_state: dict[str, Any],
    rctx: RestoreContext,
    stream: bytes,
    memo: _Memo | None = None,
    bases: list[int] | None = None,
    deep: bool = False,
) -> None:
    """Pickle the restored objects again and compare with what was captured (``deep``: with
    the pickler that walks any depth, inside :func:`deeply`).

    Equal bytes (one hash per variable) are the rule. Where they differ, the canonical
    comparison reads both streams from the first differing variable on: up to there they
    are identical, so an entry an earlier variable made is the same object in both, and
    the restore's own memo (``memo``, with each variable's first entry in ``bases``)
    says what it is. Only if that finds a difference is the whole of both streams read.
    """
    ctx = CaptureContext(workspace=rctx.files_to, namespace=namespace, fingerprint_only=True)
    sink = io.BytesIO()
    pickler = (DeepCapsulePickler if deep else CapsulePickler)(sink, ctx)

    def hashes_of(b: BufferOut) -> list[str]:
        if len(b.view):
            hit = rctx.restored_buffers.get((_address(b.view), len(b.view)))
            if hit is not None:
                return hit
        return hash_pieces(b.view)

    segments: list[tuple[int, int]] = []
    buffer_hashes: list[list[str]] = []
    differing: set[int] = set()
    for i, var in enumerate(manifest.variables):
        value = process_state if var.name == fmt.PROCESS_SEGMENT else namespace[var.name]
        start, b0 = sink.tell(), len(pickler.buffers)
        pickler.dump(value)
        segments.append((start, sink.tell()))
        hashes = [hashes_of(b) for b in pickler.buffers[b0:]]
        buffer_hashes.extend(hashes)
        if segment_fingerprint(sink.getbuffer()[start:], hashes) != var.fingerprint:
            differing.add(i)
    if ctx.problems:
        obj, why = ctx.problems[0]
        raise RestoreError(f"the restored objects could not be pickled again to check them: a "
                           f"{type(obj).__module__}.{type(obj).__qualname__}: {why}")
    _check_array_meta(manifest, pickler.buffers)
    if not differing:
        return
    # Bytes differ: compare canonical forms (string identity and set order do not count).
    original_hashes = [b.record.chunks for b in manifest.buffers]
    captured = [v.segment for v in manifest.variables]
    again = sink.getvalue()
    first = min(differing)
    if memo is not None and bases is not None and len(bases) == len(captured):
        # Every variable from the first differing one on is compared: past a difference,
        # equal bytes may refer to different memo entries.
        later = set(range(first, len(captured)))
        skip = manifest.variables[first].buffers[0]

        def extern(k: int) -> Any:
            found, obj = memo.get(k)
            if not found:
                raise ValueError(f"memo entry {k} is missing")
            return extern_token(obj, k)

        try:
            before = canonical_digests(stream, captured, original_hashes[skip:], later,
                                       first=first, base=bases[first], extern=extern)
            after = canonical_digests(again, segments, buffer_hashes[skip:], later,
                                      first=first, base=bases[first], extern=extern)
        except Exception:  # a shape the partial reading does not follow: read everything
            before, after = {}, {i: "" for i in later}
        if all(before.get(i) == after[i] for i in later):
            return
    values_before: dict[int, Any] = {}
    values_after: dict[int, Any] = {}
    before = canonical_digests(stream, captured, original_hashes, differing, values=values_before)
    after = canonical_digests(again, segments, buffer_hashes, differing, values=values_after)
    mismatched = [i for i in sorted(differing) if before[i] != after[i]]
    if mismatched:
        places = [_place(manifest.variables[i].name, difference(values_before[i], values_after[i]))
                  for i in mismatched]
        raise IntegrityError(
            "fingerprint mismatch after restore for " + ", ".join(places)
            + f" (capsule {manifest.id}): the restored value differs from the captured one; "
            "the restore was refused"
        )


def _place(name: str, path: str) -> str:
    """A variable and the path inside it where the restored value differs, in words."""
    if name != fmt.PROCESS_SEGMENT:
        return repr(name) + (f" at {name}{path}" if path else "")
    # The process segment holds the RNG states and what capture(extra=) added: a paused
    # program's frames (their locals) and its other modules' globals (sojourn.execution).
    frames = "['sojourn.execution']['main']"
    modules = "['sojourn.execution']['modules']"
    if path.startswith(frames):
        rest = path[len(frames):].replace(".callee", " → the frame it called")
        rest = re.sub(r"\.locals\[('[^']*')\]", r", its local \1", rest)
        return "the paused program's main frame" + rest
    m = re.match(re.escape(modules) + r"\[('[^']*')\]\[('[^']*')\](.*)", path)
    if m:
        return f"module {m.group(1)}, its global {m.group(2)}{m.group(3)}"
    return "the process state (random generators and what was captured with the namespace" + (
        f", at {path})" if path else ")")


def _check_array_meta(manifest: fmt.Manifest, again: list[BufferOut]) -> None:
    """An array's dtype (its byte order included), shape and layout are in its buffer's
    meta, not in the fingerprint: the restored arrays must give the captured meta again.
    (Buffers that differ in number differ in the stream too: the fingerprints say so.)"""
    if len(again) != len(manifest.buffers):
        return
    owners = [v.name for v in manifest.variables for _ in range(*v.buffers)]
    wrong = sorted({
        owners[j] for j, (old, new) in enumerate(zip(manifest.buffers, again, strict=True))
        if old.kind == "ndarray" and (new.kind != old.kind or json.loads(json.dumps(new.meta)) != old.meta)
    })
    if wrong:
        raise IntegrityError(
            "the restored arrays of " + ", ".join(repr(n) for n in wrong) + f" (capsule {manifest.id}) "
            "have another dtype, byte order or shape than the captured ones; the restore was refused"
        )
