"""``sojourn gc``: delete the chunks no live capsule needs (and, on request, old capsules).

Mark and sweep over the whole repository:

* **roots**: every stored capsule, except the ones a policy prunes. ``--keep-last N`` prunes,
  per workspace, capsules older than its N newest, unless one is the workspace's
  ``last_capsule`` or the snapshot of its files (``files`` event), a fork point, or needed by another workspace that keeps it; a running
  workspace is never pruned (its session captures with its newest capsule as parent).
  ``--prune-orphans`` prunes capsules that belong to no workspace (``sojourn.capture``'s).
* **mark**: every chunk each root needs: its stream, its buffers, its file list and the
  chunks of every file in it. A root whose manifest or file list cannot be read stops gc:
  it cannot tell what that capsule needs, and guessing would delete data.
* **sweep**: pruned manifests first (a crash then leaves only unreferenced chunks, never a
  capsule with a hole), then every unmarked chunk.

Safety against a concurrent capture comes from the repository locks
(``repository/locks.py``): the plan is made without a lock, then, under the exclusive gc
lock, taken only once no capture is in flight and keeping new captures out, the capsule list
and every workspace log are read again. Any capsule stored since the plan is a root; any
capsule a workspace started to name since (a fork) is no longer pruned. The chunk listing is
taken under the lock too. So every capsule that exists or can come to exist before the lock
is released is accounted for, and a capture's skipped-because-present chunks are either
named by a manifest that the locked pass read, or the capture has not started yet.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from sojourn.errors import IntegrityError, ObjectNotFound, RepositoryError
from sojourn.repository.locks import HeldLock, LockInfo, take_gc_lock
from sojourn.threads import Executor
from sojourn.workspace.errors import WorkspaceError
from sojourn.workspace.history import Inventory
from sojourn.workspace.store import WorkspaceStore

Progress = Callable[[str, dict[str, Any]], None]
_BATCH = 256


@dataclass
class GcResult:
    dry_run: bool
    capsules: int  # stored when gc looked
    capsules_kept: int
    capsules_pruned: list[str]
    orphans: list[str]  # capsules of no workspace (kept unless --prune-orphans)
    chunks: int  # stored when gc looked (under the lock)
    chunks_kept: int
    chunks_deleted: int
    bytes_freed: int
    seconds: float
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def collect(store: WorkspaceStore, *, keep_last: int | None = None, prune_orphans: bool = False,
            dry_run: bool = False, wait: float = 300.0, on_progress: Progress | None = None) -> GcResult:
    if keep_last is not None and keep_last < 1:
        raise WorkspaceError("--keep-last must be at least 1: a workspace always keeps the capsule it stands on")
    t0 = time.monotonic()
    say = on_progress or (lambda kind, data: None)
    inv = Inventory(store)
    inv.load_workspaces()
    inv.list_capsules()
    notes: list[str] = []
    prune = _plan(inv, keep_last, prune_orphans, notes)
    marked: set[str] = set()
    done: set[str] = set()  # capsules whose chunks are marked
    _mark(inv, set(inv.listed) - prune, marked, done)
    if dry_run:
        return _finish_dry(inv, prune, marked, notes, t0)

    def waiting(live: list[LockInfo]) -> None:
        say("waiting", {"captures": len(live)})

    lock = take_gc_lock(store.backend, wait=wait, on_wait=waiting)
    try:
        say("locked", {"generation": lock.generation})
        # Under the lock nothing new can start: read what changed since the plan, and plan
        # again. A capsule stored since is a root (it was in no plan); one that a workspace
        # began to need (a fork from it, a resume) drops out of the new plan.
        before = set(inv.listed)
        inv.refresh_workspaces()
        now = set(inv.list_capsules())
        replanned = _plan(inv, keep_last, prune_orphans, [])
        rescued = prune - replanned
        if rescued:
            notes.append(f"{len(rescued)} capsule(s) became needed while gc ran and were kept")
        prune = prune & replanned & before & now
        _mark(inv, now - prune, marked, done)
        names = list(store.backend.list("chunks"))
        garbage = [n for n in names if n not in marked]
        say("sweep", {"capsules": len(prune), "chunks": len(garbage)})
        for cap in sorted(prune):
            _check(lock)
            try:
                store.backend.remove("capsules", cap + ".json")
            except ObjectNotFound:
                pass
        store.backend.flush()
        freed = _sweep(store, lock, garbage)
        store.backend.flush()
    finally:
        lock.release()
    orphans = _orphans(inv, set(now))
    return GcResult(False, len(now), len(now - prune), sorted(prune), sorted(orphans), len(names),
                    len(names) - len(garbage), len(garbage), freed, round(time.monotonic() - t0, 3), notes)


def _plan(inv: Inventory, keep_last: int | None, prune_orphans: bool, notes: list[str]) -> set[str]:
    belongs = inv.belongs()
    prune: set[str] = set()
    if prune_orphans:
        prune |= _orphans(inv, inv.listed)
    if keep_last is None:
        return prune
    forks = set(inv.fork_points())
    keep: set[str] = set()
    candidates: set[str] = set()
    for w in inv.workspaces.values():
        mine = [c for c, owners in belongs.items() if w.id in owners and c in inv.listed]
        if w.state == "running":
            keep.update(mine)
            if mine:
                notes.append(f"{w.name} ({w.id}) is running: none of its capsules were pruned")
            continue
        mine.sort(key=lambda c: _age_key(inv, c), reverse=True)
        keep.update(mine[:keep_last])
        keep.update(w.standing)
        candidates.update(mine[keep_last:])
    prune |= (candidates - keep - forks)
    return prune


def _age_key(inv: Inventory, cap: str) -> tuple[str, float]:
    m = inv.manifest(cap)
    entries = [w.named.get(cap) for w in inv.workspaces.values()]
    t = max((e.time for e in entries if e is not None), default=0.0)
    return (m.created if m is not None else "", t)


def _orphans(inv: Inventory, caps: set[str]) -> set[str]:
    belongs = inv.belongs()
    return {c for c in caps if not belongs.get(c)}


def _mark(inv: Inventory, roots: set[str], marked: set[str], done: set[str]) -> None:
    for cap in sorted(roots - done):
        done.add(cap)
        m = inv.manifest(cap)
        if m is None:
            if cap in inv.unreadable:
                raise WorkspaceError(
                    f"gc stopped before deleting anything: capsule {cap} cannot be read "
                    f"({inv.unreadable[cap]}), so gc cannot tell which chunks it needs. Remove or "
                    "repair that manifest first."
                )
            continue  # listed but removed since: it names nothing any more
        try:
            marked.update(m.all_chunk_names(inv.repo.chunks))
        except (IntegrityError, ObjectNotFound) as e:
            raise WorkspaceError(
                f"gc stopped before deleting anything: the file list of capsule {cap} cannot be read "
                f"({e}), so gc cannot tell which file chunks it needs."
            ) from None


def _check(lock: HeldLock) -> None:
    why = lock.lost or lock.check()
    if why is not None:
        raise RepositoryError(f"gc stopped: {why}; what was deleted so far was unreferenced")


def _sweep(store: WorkspaceStore, lock: HeldLock, garbage: list[str]) -> int:
    backend = store.backend

    def remove(name: str) -> int:
        size = backend.stat("chunks", name) or 0
        try:
            backend.remove("chunks", name)
        except ObjectNotFound:
            return 0
        return size

    freed = 0
    local = type(backend).__name__ in ("LocalBackend", "MemoryBackend")
    with Executor(1 if local else 16, thread_name_prefix="sojourn-gc") as pool:
        for i in range(0, len(garbage), _BATCH):
            _check(lock)  # a gc whose lock was taken over stops between batches
            freed += sum(pool.map(remove, garbage[i : i + _BATCH]))
    return freed


def _finish_dry(inv: Inventory, prune: set[str], marked: set[str], notes: list[str], t0: float) -> GcResult:
    backend = inv.repo.backend
    names = list(backend.list("chunks"))
    garbage = [n for n in names if n not in marked]
    freed = sum(backend.stat("chunks", n) or 0 for n in garbage)
    notes.append("dry run: nothing was deleted; captures running now may still need some of these chunks, "
                 "which a real run would see")
    return GcResult(True, len(inv.listed), len(inv.listed - prune), sorted(prune), sorted(_orphans(inv, inv.listed)),
                    len(names), len(names) - len(garbage), len(garbage), freed, round(time.monotonic() - t0, 3),
                    notes)
