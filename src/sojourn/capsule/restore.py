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

import io
import os
import pickle
import sys
import time
from pathlib import Path
from typing import Any

from sojourn.capsule import format as fmt
from sojourn.capsule import reducers  # noqa: F401  (registers every reducer)
from sojourn.capsule.context import RestoreContext, restoring
from sojourn.capsule.environment import check_distributions
from sojourn.capsule.fingerprint import canonical_digests, hash_pieces, segment_fingerprint
from sojourn.capsule.pickler import BufferOut, CapsulePickler, CaptureContext
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


def read_all(repo: Repository, manifest: fmt.Manifest) -> tuple[bytes, list[Any], dict[tuple[int, int], list[str]]]:
    """Read and check every chunk of the capsule; nothing is unpickled here."""
    objects: list[Any] = []
    pairs: list[tuple[BufferRecord, memoryview]] = []
    known: dict[tuple[int, int], list[str]] = {}
    for buf in manifest.buffers:
        obj, view = _allocate(buf)
        objects.append(obj)
        pairs.append((buf.record, view))
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
) -> Restored:
    t0 = time.perf_counter()
    manifest = fmt.load_manifest(repo, capsule)
    notes = check_distributions(manifest.distributions, manifest.environment)
    files_root = Path(files_to).absolute()
    if manifest.files:
        from sojourn.capsule.workspace_files import materialize

        materialize(manifest.files, repo.chunks, files_root)
    t_files = time.perf_counter()
    stream, objects, known = read_all(repo, manifest)
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
    with restoring(ctx):
        unpickler = pickle.Unpickler(io.BytesIO(stream), buffers=iter(objects))
        for var in manifest.variables:
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
            check_fingerprints(manifest, namespace, process_state, ctx, stream)
    apply_process_state(process_state)
    t_end = time.perf_counter()
    out = namespace if isinstance(namespace, Restored) else Restored()
    out.manifest = manifest
    out.process = process_state
    out.notes = notes + ctx.warnings
    out.timings = {
        "files": t_files - t0,
        "read": t_read - t_files,
        "unpickle": t_load - t_read,
        "fingerprints": t_end - t_load,
        "total": t_end - t0,
    }
    if into is not None:
        out.update({v.name: namespace[v.name] for v in manifest.variables if v.name in namespace})
    return out


def check_fingerprints(
    manifest: fmt.Manifest,
    namespace: dict[str, Any],
    process_state: dict[str, Any],
    rctx: RestoreContext,
    stream: bytes,
) -> None:
    """Pickle the restored objects again and compare with what was captured."""
    ctx = CaptureContext(workspace=rctx.files_to, namespace=namespace, fingerprint_only=True)
    sink = io.BytesIO()
    pickler = CapsulePickler(sink, ctx)

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
        raise RestoreError("the restored objects could not be pickled again to check them")
    if not differing:
        return
    # Bytes differ: compare canonical forms (string identity and set order do not count).
    original_hashes = [b.record.chunks for b in manifest.buffers]
    before = canonical_digests(stream, [v.segment for v in manifest.variables], original_hashes, differing)
    after = canonical_digests(sink.getvalue(), segments, buffer_hashes, differing)
    mismatched = [manifest.variables[i].name for i in sorted(differing) if before[i] != after[i]]
    if mismatched:
        raise IntegrityError(
            "fingerprint mismatch after restore for "
            + ", ".join(repr(n) for n in mismatched)
            + f" (capsule {manifest.id}): the restored value differs from the captured one; "
            "the restore was refused"
        )
