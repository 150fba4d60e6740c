"""Capture: namespace → one pickle stream + out-of-band buffers → chunks → signed manifest.

Order of work, and why:

1. pickle every variable into one stream with one memo (aliasing across variables
   survives), recording each variable's segment and buffers; problems are collected, not
   raised, so that the error lists every object that cannot travel;
2. snapshot the workspace files (open writers were flushed by their reducer in step 1);
3. write buffer chunks, file chunks and stream chunks in parallel (only new ones);
4. flush, then write the manifest: a manifest never names a chunk that is not durable.
"""

from __future__ import annotations

import io
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sojourn.capsule import format as fmt
from sojourn.capsule import reducers  # noqa: F401  (registers every reducer)
from sojourn.capsule.environment import distributions_for
from sojourn.capsule.fingerprint import segment_fingerprint
from sojourn.capsule.pickler import BufferOut, CapsulePickler, CaptureContext
from sojourn.capsule.reducers.rng import capture_process_state
from sojourn.capsule.scan import problems_with_paths
from sojourn.errors import CaptureError, Problem
from sojourn.repository.chunks import WriteStats
from sojourn.repository.locks import holds_capture_lock
from sojourn.repository.repo import Repository

# Names a module or a notebook defines for itself: they describe the running process, not
# the user's state, and restoring them would clobber the destination's own.
SKIPPED_NAMES = frozenset(
    {
        "__name__", "__file__", "__loader__", "__spec__", "__builtins__", "__cached__",
        "__package__", "__doc__", "__annotations__", "__path__",
        # IPython's own; notebook support handles history separately.
        "In", "Out", "get_ipython", "exit", "quit", "_ih", "_oh", "_dh", "_", "__", "___",
    }
)


def skipped(name: str) -> bool:
    return name in SKIPPED_NAMES or name.startswith("__sojourn") or (
        name.startswith("_i") and name[2:].isdigit()
    ) or (name.startswith("_") and name[1:].isdigit())


@dataclass
class Pickled:
    """The result of pickling a namespace, before anything is written."""

    stream: bytes
    names: list[str]
    types: list[str]
    segments: list[tuple[int, int]]
    buffer_ranges: list[tuple[int, int]]
    buffers: list[BufferOut]
    ctx: CaptureContext
    values: list[Any]


def pickle_namespace(
    namespace: dict[str, Any],
    *,
    workspace: Path | None = None,
    extra: dict[str, Any] | None = None,
) -> Pickled:
    ctx = CaptureContext(workspace=workspace, namespace=namespace)
    sink = io.BytesIO()
    pickler = CapsulePickler(sink, ctx)
    names = [n for n in namespace if isinstance(n, str) and not skipped(n)]
    segments: list[tuple[int, int]] = []
    ranges: list[tuple[int, int]] = []
    types_: list[str] = []
    roots: dict[str, Any] = {}
    values = [(n, namespace[n]) for n in names]
    values.append((fmt.PROCESS_SEGMENT, {**capture_process_state(), **(extra or {})}))
    for name, value in values:
        start, b0 = sink.tell(), len(pickler.buffers)
        pickler.dump(value)
        segments.append((start, sink.tell()))
        ranges.append((b0, len(pickler.buffers)))
        types_.append(_type_name(value))
        roots[name] = value
    if ctx.problems:
        problems = problems_with_paths(roots, ctx.problems)
        raise CaptureError(_problems_message(problems), problems)
    return Pickled(
        sink.getvalue(), [n for n, _ in values], types_, segments, ranges, pickler.buffers, ctx,
        [v for _, v in values],
    )


def _type_name(value: Any) -> str:
    t = type(value)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _problems_message(problems: list[Problem]) -> str:
    lines = [f"{len(problems)} object(s) cannot travel in a capsule; nothing was written:"]
    lines += [f"  - {p}" for p in problems]
    return "\n".join(lines)


@holds_capture_lock  # gc never deletes a chunk this capture reuses (repository/locks.py)
def capture_namespace(
    namespace: dict[str, Any],
    repo: Repository,
    *,
    files: str | os.PathLike[str] | None = None,
    parent: str | None = None,
    labels: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
) -> fmt.Manifest:
    t0 = time.perf_counter()
    workspace = Path(files).absolute() if files is not None else Path.cwd()
    pickled = pickle_namespace(namespace, workspace=workspace, extra=extra)
    t_pickle = time.perf_counter()

    stats = WriteStats()
    parent_manifest = fmt.load_manifest(repo, parent) if parent else None
    files_json = None
    if files is not None:
        from sojourn.capsule.workspace_files import snapshot

        previous = parent_manifest.files if parent_manifest is not None else None
        files_json = snapshot(Path(files), repo.chunks, stats, previous=previous)

    views = [b.view for b in pickled.buffers]
    records = repo.chunks.put_many(views, stats)
    stream_record = repo.chunks.put(pickled.stream, stats, codec="zstd")
    t_write = time.perf_counter()

    stream = memoryview(pickled.stream)
    variables = []
    for i, name in enumerate(pickled.names):
        start, end = pickled.segments[i]
        b0, b1 = pickled.buffer_ranges[i]
        fp = segment_fingerprint(stream[start:end], [records[j].chunks for j in range(b0, b1)])
        size = (end - start) + sum(records[j].size for j in range(b0, b1))
        variables.append(fmt.Variable(name, pickled.types[i], size, fp, (start, end), (b0, b1)))

    manifest = fmt.Manifest(
        stream=stream_record,
        variables=variables,
        buffers=[fmt.Buffer(b.kind, b.meta, r) for b, r in zip(pickled.buffers, records, strict=True)],
        parent=parent_manifest.id if parent_manifest is not None else None,
        created=fmt.now(),
        environment=fmt.environment(),
        distributions=distributions_for(pickled.ctx.modules),
        user_modules=pickled.ctx.user_modules,
        files=files_json,
        devices=pickled.ctx.devices,
        labels=labels or {},
    )
    manifest.stats = {
        "bytes_logical": stats.logical,
        "bytes_written": stats.written,
        "chunks_new": stats.chunks_new,
        "chunks_reused": stats.chunks_reused,
        "seconds_pickle": round(t_pickle - t0, 6),
        "seconds_write": round(t_write - t_pickle, 6),
    }
    fmt.store_manifest(repo, manifest)
    manifest.stats["seconds_total"] = round(time.perf_counter() - t0, 6)
    return manifest
