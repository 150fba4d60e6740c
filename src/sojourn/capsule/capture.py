"""Capture: namespace → one pickle stream + out-of-band buffers → chunks → signed manifest.

Order of work, and why:

1. pickle every variable into one stream with one memo (aliasing across variables
   survives), recording each variable's segment and buffers; problems are collected, not
   raised, so that the error lists every object that cannot travel. The chunks of each
   variable's buffers are hashed and written while the next variables are pickled (until
   a problem is found: from then on nothing more is written);
2. snapshot the workspace files (open writers were flushed by their reducer in step 1);
3. write file chunks and stream chunks (only new ones), and wait for every write;
4. flush, then write the manifest: a manifest never names a chunk that is not durable.
   A capture that fails writes no manifest; chunks it had already stored are named by no
   capsule, and the error says so.
"""

from __future__ import annotations

import io
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sojourn.capsule import format as fmt
from sojourn.capsule import reducers  # noqa: F401  (registers every reducer)
from sojourn.capsule.environment import distributions_for, record_needs, record_packages
from sojourn.capsule.fingerprint import segment_fingerprint
from sojourn.capsule.pickler import (
    BYTES_PER_LEVEL,
    DEEP_STACKS,
    BufferOut,
    CapsulePickler,
    CaptureContext,
    DeepCapsulePickler,
    NoDeepStack,
    deeply,
)
from sojourn.capsule.reducers.matplotlib import pyplot_state
from sojourn.capsule.reducers.rng import capture_process_state
from sojourn.capsule.scan import problems_with_paths
from sojourn.errors import CaptureError, Problem
from sojourn.repository.chunks import BufferRecord, PendingPut, WriteStats
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


# Buffers are written while pickling goes on once this many bytes of them are waiting.
EARLY_WRITE_BYTES = 16 << 20


# Names for the paths of problems: roots searched first (in the program's words) and a
# label for internal root names (see sojourn.capsule.scan.find_paths).
PathNames = tuple[dict[str, Any] | None, Callable[[str], str] | None]


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
    on_variable: Callable[[list[BufferOut], bool], None] | None = None,
    paths: PathNames | None = None,
    deep: bool = False,
) -> Pickled:
    """Pickle ``namespace``; ``on_variable(buffers, clean)`` sees each variable's buffers as
    soon as it is pickled (``clean``: no problem found so far). ``paths``: how problems are
    named (``scan.find_paths``' ``first`` and ``label``). ``deep``: with the pickler that walks
    any depth (call it inside :func:`deeply`)."""
    ctx = CaptureContext(workspace=workspace, namespace=namespace)
    sink = io.BytesIO()
    pickler = (DeepCapsulePickler if deep else CapsulePickler)(sink, ctx)
    names = [n for n in namespace if isinstance(n, str) and not skipped(n)]
    segments: list[tuple[int, int]] = []
    ranges: list[tuple[int, int]] = []
    types_: list[str] = []
    roots: dict[str, Any] = {}
    values = [(n, namespace[n]) for n in names]
    values.append((fmt.PROCESS_SEGMENT, {**capture_process_state(), **pyplot_state(), **(extra or {})}))
    for name, value in values:
        start, b0 = sink.tell(), len(pickler.buffers)
        pickler.begin_variable(name)
        ctx.current_root = name
        pickler.dump(value)
        segments.append((start, sink.tell()))
        ranges.append((b0, len(pickler.buffers)))
        types_.append(_type_name(value))
        roots[name] = value
        if on_variable is not None:
            on_variable(pickler.buffers[b0:], not ctx.problems)
    # The pickler and its buffer callback refer to each other: until the cyclic collector
    # runs, its memo would keep every pickled object alive (a deleted array's memory too).
    pickler.release()
    if ctx.problems:
        first, label = paths if paths is not None else (None, None)
        problems = problems_with_paths(roots, ctx.problems, first=first, label=label, found_in=ctx.problem_roots)
        raise CaptureError(_problems_message(problems), problems)
    return Pickled(
        sink.getvalue(), [n for n, _ in values], types_, segments, ranges, pickler.buffers, ctx,
        [v for _, v in values],
    )


def _wait_quietly(pending: list[PendingPut]) -> None:
    # A failing capture still waits for its writes: they read the user's buffers.
    for job in pending:
        try:
            job.wait()
        except Exception:
            pass


def _type_name(value: Any) -> str:
    t = type(value)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _problems_message(problems: list[Problem], stats: WriteStats | None = None) -> str:
    if stats is None or not stats.chunks_new:
        written = "nothing was written"
    else:
        written = (
            f"no capsule was written ({stats.chunks_new} chunk(s), {stats.written} bytes, of "
            "arrays pickled before the first problem were already stored; no capsule refers "
            "to them and `sojourn gc` removes them)"
        )
    lines = [f"{len(problems)} object(s) cannot travel in a capsule; {written}:"]
    lines += [f"  - {p}" for p in problems]
    return "\n".join(lines)


# gc safety (history helper, docs/history-and-gc.md): a shared repository lock from the
# first chunk written or skipped until the manifest is stored, so gc cannot delete them.
@holds_capture_lock
def capture_namespace(
    namespace: dict[str, Any],
    repo: Repository,
    *,
    files: str | os.PathLike[str] | None = None,
    parent: str | None = None,
    labels: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
    include_secrets: bool | Iterable[str] | None = None,
    paths: PathNames | None = None,
) -> fmt.Manifest:
    t0 = time.perf_counter()
    workspace = Path(files).absolute() if files is not None else Path.cwd()
    parent_manifest = fmt.load_manifest(repo, parent) if parent else None
    stats = WriteStats()
    pending: list[PendingPut] = []
    waiting: list[BufferOut] = []

    def write_early(buffers: list[BufferOut], clean: bool) -> None:
        # Writing arrays while the next variables are pickled hides the pickling behind the
        # disk. Once a problem is known the capture will fail: stop writing. Small states
        # are written at the end, so that a failing capture of one writes nothing at all.
        waiting.extend(buffers)
        if clean and sum(b.view.nbytes for b in waiting) >= EARLY_WRITE_BYTES:
            pending.append(repo.chunks.start_put_many([b.view for b in waiting], stats))
            waiting.clear()

    try:
        try:
            pickled = pickle_namespace(namespace, workspace=workspace, extra=extra, on_variable=write_early, paths=paths)
        except RecursionError:
            # Nested deeper than this stack: once more, on a thread with a stack for it (the
            # buffers seen so far come again; chunks already stored are not written twice).
            waiting.clear()
            pickled = deeply(pickle_namespace, namespace, workspace=workspace, extra=extra,
                             on_variable=write_early, paths=paths, deep=True)
    except NoDeepStack:
        _wait_quietly(pending)
        raise CaptureError("the namespace holds objects nested deeper than this thread's stack, and no thread "
                           "with a deeper one could be started (an address-space limit such as `ulimit -v`?); "
                           "nothing was written. Raise the limit, or flatten deep structures (nodes in a list, "
                           "links by index) before the pause", []) from None
    except RecursionError:
        _wait_quietly(pending)
        raise CaptureError(f"the namespace holds objects nested deeper than sojourn can pickle (about "
                           f"{DEEP_STACKS[0] // BYTES_PER_LEVEL // 5} levels), or an object whose pickling "
                           "calls itself without end (a __getattribute__ or __reduce__ that recurses); "
                           "nothing was written. Flatten deep structures (nodes in a list, links by "
                           "index) before the pause", []) from None
    except CaptureError as e:
        _wait_quietly(pending)
        raise CaptureError(_problems_message(e.problems, stats), e.problems) from None
    except BaseException:
        _wait_quietly(pending)
        raise
    t_pickle = time.perf_counter()

    files_json = None
    try:
        if files is not None:
            from sojourn.capsule.workspace_files import snapshot

            previous = parent_manifest.files if parent_manifest is not None else None
            files_json = snapshot(Path(files), repo.chunks, stats, previous=previous, include_secrets=include_secrets)
        if waiting:
            pending.append(repo.chunks.start_put_many([b.view for b in waiting], stats))
        stream_put = repo.chunks.start_put_many([memoryview(pickled.stream)], stats, codec="zstd")
    except BaseException:
        _wait_quietly(pending)
        raise
    records: list[BufferRecord] = []
    errors: list[BaseException] = []
    for job in [*pending, stream_put]:
        try:
            records.extend(job.wait())
        except Exception as e:  # every write ends before anything is raised
            errors.append(e)
    if errors:
        raise errors[0]
    stream_record = records.pop()
    t_write = time.perf_counter()

    stream = memoryview(pickled.stream)
    variables = []
    for i, name in enumerate(pickled.names):
        start, end = pickled.segments[i]
        b0, b1 = pickled.buffer_ranges[i]
        fp = segment_fingerprint(stream[start:end], [records[j].chunks for j in range(b0, b1)])
        size = (end - start) + sum(records[j].size for j in range(b0, b1))
        variables.append(fmt.Variable(name, pickled.types[i], size, fp, (start, end), (b0, b1)))

    needs = record_needs(pickled.ctx.module_users, skip={m.partition('.')[0] for m in pickled.ctx.user_modules})
    manifest = fmt.Manifest(
        stream=stream_record,
        variables=variables,
        buffers=[fmt.Buffer(b.kind, b.meta, r) for b, r in zip(pickled.buffers, records, strict=True)],
        parent=parent_manifest.id if parent_manifest is not None else None,
        created=fmt.now(),
        environment=fmt.environment(),
        distributions=distributions_for(pickled.ctx.modules),
        needs=needs,
        packages=record_packages(needs),
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
