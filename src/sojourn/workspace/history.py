"""Forks and the capsule DAG: ``sojourn fork`` and ``sojourn history``.

A capsule names its parent; a fork is a new workspace whose log starts on an existing
capsule of another one, so capsules form a DAG that spans workspaces. Nothing is copied:
chunks are content-addressed, so the fork and its source share every chunk until they
diverge. The truth stays in the event logs (``created`` carries ``forked_from``) and in the
manifests (``parent``, and the ``sojourn.workspace`` label every session writes); this module
reads both into an :class:`Inventory` that ``history`` prints and ``gc`` (``gc.py``) marks from.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from sojourn.capsule import format as fmt
from sojourn.errors import IntegrityError, ObjectNotFound
from sojourn.repository.locks import capture_lock
from sojourn.workspace import events as E
from sojourn.workspace import records as R
from sojourn.workspace.authority import reap
from sojourn.workspace.capsules import capsule_facts, record_python, verify_capsule
from sojourn.workspace.errors import WorkspaceError
from sojourn.workspace.liveness import me
from sojourn.workspace.store import WorkspaceStore

LABEL = "sojourn.workspace"  # what session.py writes: {workspace, allocation, epoch}
EXECUTION_LABEL = "sojourn.execution"  # the engine's: reason, where, argv...
FILES_LABEL = "sojourn.files"  # a workspace's file snapshot (workspace/files.py): {workspace, source}


# -- what the repository says about capsules and workspaces ------------------------------------


@dataclass
class WorkspaceRefs:
    """The capsules one workspace's log names, and where it came from."""

    id: str
    name: str
    state: str
    record: R.WorkspaceRecord
    forked_from: dict[str, Any] | None
    named: dict[str, R.CapsuleEntry | None] = field(default_factory=dict)  # id -> its capsule event

    @property
    def last_capsule(self) -> str | None:
        return self.record.last_capsule.id if self.record.last_capsule else None

    @property
    def files_capsule(self) -> str | None:
        """The capsule holding the workspace's current file manifest (``files`` event)."""
        files = getattr(self.record, "files", None)
        cap = files.get("capsule") if isinstance(files, dict) else None
        return str(cap) if cap else None

    @property
    def standing(self) -> set[str]:
        """Capsules the workspace cannot do without: what it resumes from, its files."""
        return {c for c in (self.last_capsule, self.files_capsule) if c}


class Inventory:
    """Every workspace's capsule references and every capsule manifest, read once."""

    def __init__(self, store: WorkspaceStore):
        self.store = store
        self.repo = store.repo
        self.workspaces: dict[str, WorkspaceRefs] = {}
        self.manifests: dict[str, fmt.Manifest] = {}
        self.unreadable: dict[str, str] = {}  # capsule id -> why its manifest cannot be read
        self.listed: set[str] = set()

    # workspaces ------------------------------------------------------------------------------

    def load_workspaces(self) -> None:
        for ws in self.store.ids():
            if ws not in self.workspaces:
                self.workspaces[ws] = self.refs(ws)

    def refresh_workspaces(self) -> None:
        """Read every workspace again (new ones, and events appended since)."""
        for ws in self.store.ids():
            self.workspaces[ws] = self.refs(ws)

    def refs(self, ws: str) -> WorkspaceRefs:
        rec = self.store.record(ws, save=False)
        first = self._first_event(ws)
        forked = first.get("forked_from") if first else None
        out = WorkspaceRefs(ws, rec.name, rec.state, rec, forked if isinstance(forked, dict) else None)
        for entry in rec.capsules:
            out.named[entry.id] = entry
        for a in rec.allocations:
            if a.capsule_in:
                out.named.setdefault(a.capsule_in, None)
            if a.capsule_out:
                out.named.setdefault(a.capsule_out, None)
        if out.forked_from and out.forked_from.get("capsule"):
            out.named.setdefault(str(out.forked_from["capsule"]), None)
        if out.files_capsule:
            out.named.setdefault(out.files_capsule, None)
        return out

    def _first_event(self, ws: str) -> dict[str, Any] | None:
        try:
            return self.store.event(ws, 1)
        except WorkspaceError:
            return None

    # capsules --------------------------------------------------------------------------------

    def list_capsules(self) -> list[str]:
        """Capsule ids stored now (new ones are remembered too)."""
        names = [n[: -len(".json")] for n in self.repo.backend.list("capsules") if n.endswith(".json")]
        self.listed.update(names)
        return names

    def manifest(self, cap: str) -> fmt.Manifest | None:
        """The checked manifest, or None when it is missing or unreadable (see ``unreadable``)."""
        m = self.manifests.get(cap)
        if m is not None or cap in self.unreadable:
            return m
        try:
            raw = self.repo.backend.load("capsules", cap + ".json")
            m = fmt.open_manifest(raw, self.repo.key, expected_id=cap)
        except ObjectNotFound:
            return None
        except IntegrityError as e:
            self.unreadable[cap] = str(e)
            return None
        self.manifests[cap] = m
        return m

    def owner(self, cap: str) -> str | None:
        """The workspace whose session wrote ``cap`` (its label), if any."""
        m = self.manifest(cap)
        if m is None:
            return None
        for label in (LABEL, FILES_LABEL):
            info = m.labels.get(label)
            ws = info.get("workspace") if isinstance(info, dict) else None
            if ws:
                return str(ws)
        return None

    def belongs(self) -> dict[str, set[str]]:
        """Capsule id -> the workspaces it belongs to (named by their logs, or labelled as
        written by their sessions: checkpoints, and a capsule whose event is not written yet)."""
        out: dict[str, set[str]] = {}
        for w in self.workspaces.values():
            for cap in w.named:
                out.setdefault(cap, set()).add(w.id)
        for cap in self.listed:
            ws = self.owner(cap)
            if ws is not None and ws in self.workspaces:
                out.setdefault(cap, set()).add(ws)
        return out

    def fork_points(self) -> dict[str, list[str]]:
        """Capsule id -> the workspaces forked from it."""
        out: dict[str, list[str]] = {}
        for w in self.workspaces.values():
            if w.forked_from and w.forked_from.get("capsule"):
                out.setdefault(str(w.forked_from["capsule"]), []).append(w.id)
        return out


# -- fork ------------------------------------------------------------------------------------


@dataclass
class ForkResult:
    workspace: str
    name: str
    source: str
    source_name: str
    capsule: str
    state: str
    hint: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def fork(store: WorkspaceStore, ref: str, *, name: str | None = None, capsule: str | None = None) -> ForkResult:
    """A new workspace that carries on from a capsule of ``ref`` (its last good one, or
    ``capsule``): suspended, so ``sojourn resume NEW`` runs it. The source is untouched (it
    may be running); the two share chunks and then go their own ways."""
    src = store.resolve(ref)
    rec = reap(store, store.record(src), by="sojourn fork")
    inv = Inventory(store)
    entry = _fork_capsule(inv, rec, capsule)
    with capture_lock(store.repo.chunks, purpose=f"fork of {src}"):
        # Under the shared lock a gc cannot delete the capsule between this check and the
        # events that make it the fork's own (gc reads every log under its exclusive lock).
        m = inv.manifest(entry.id)
        if m is None:
            raise WorkspaceError(f"capsule {entry.id} of {src} is no longer in the repository "
                                 f"({inv.unreadable.get(entry.id, 'removed by gc')}); choose another with --capsule")
        meta = store.create(rec.command, name, default_name=f"{rec.name}-fork", creator=me())
        new = meta["id"]
        origin = {"workspace": src, "name": rec.name, "capsule": entry.id}
        facts = capsule_facts(store.repo, entry.id)
        fork_entry = R.CapsuleEntry(**{**asdict(entry), "verified": True, "error": None})
        store.append(new, 0, "fork",
                     {"type": "created", "name": meta["name"], "command": meta["command"], "forked_from": origin},
                     {"type": "capsule", "capsule": asdict(fork_entry), "forked_from": origin,
                      "distributions": facts.get("distributions"), "arch": facts.get("arch")},
                     E.stop(None, "suspended", f"forked from {rec.name} ({src}) at {entry.id}", standing=entry.id,
                            ran=False))
    store.record(new)
    try:  # a note in the source's log, for `sojourn show`; the fork's own log is the truth
        store.append(src, rec.epoch, "fork", {"type": "note", "message": f"forked into {meta['name']} ({new}) at "
                                              f"{entry.id}", "fork": {"workspace": new, "capsule": entry.id}})
    except Exception:
        pass
    return ForkResult(new, meta["name"], src, rec.name, entry.id, "suspended",
                      f"`sojourn resume {meta['name']}` carries the fork on from {entry.id}")


def _fork_capsule(inv: Inventory, rec: R.WorkspaceRecord, capsule: str | None) -> R.CapsuleEntry:
    if capsule is None:
        if rec.last_capsule is None:
            raise WorkspaceError(f"workspace {rec.id} has no capsule that passed its write check to fork from; "
                                 f"`sojourn suspend {rec.id}` writes one")
        return rec.last_capsule
    try:
        cap = fmt.resolve_id(inv.repo, capsule)
    except ObjectNotFound as e:
        raise WorkspaceError(f"{e}; `sojourn history {rec.id}` lists its capsules") from None
    for entry in rec.capsules:
        if entry.id == cap:
            if not entry.verified:
                raise WorkspaceError(f"capsule {cap} failed its write check ({entry.error}); it cannot be forked")
            return entry
    m = inv.manifest(cap)
    if m is None:
        raise WorkspaceError(f"capsule {cap} cannot be read: {inv.unreadable.get(cap, 'missing')}")
    if inv.owner(cap) != rec.id:
        raise WorkspaceError(f"capsule {cap} is not one of workspace {rec.id}'s capsules; "
                             f"`sojourn history {rec.id}` lists them")
    info = m.labels.get(EXECUTION_LABEL)
    if not isinstance(info, dict):
        raise WorkspaceError(f"capsule {cap} holds a namespace, not a paused program; it cannot be resumed")
    # A checkpoint the program took and carried on from has had no write check yet: run it,
    # so that the fork, like every workspace, stands on a capsule that passed one.
    python = record_python(rec)
    error = verify_capsule(inv.repo.url, cap, python=python, cwd=rec.command.cwd)
    if error is not None:
        raise WorkspaceError(f"capsule {cap} failed its write check: {error}")
    label = m.labels.get(LABEL) or {}
    return R.CapsuleEntry(id=cap, parent=m.parent, reason=str(info.get("reason", "checkpoint")),
                          where=str(info.get("where", "")), size=m.size, time=R.now(),
                          allocation=str(label.get("allocation", "")), verified=True)


# -- history ---------------------------------------------------------------------------------


@dataclass
class HistoryNode:
    capsule: str
    parent: str | None
    created: str  # the manifest's creation time (UTC), "" when the manifest is gone
    time: float | None  # when a workspace recorded it
    size: int
    reason: str  # checkpoint, suspend, SIGTERM, oom, move, ...
    where: str
    workspace: str | None  # the workspace whose session wrote it
    workspace_name: str | None
    allocation: str | None
    machine: str | None
    verified: bool | None
    named_by: list[str] = field(default_factory=list)  # workspaces whose log names it
    last_of: list[str] = field(default_factory=list)  # workspaces that stand on it now
    forks: list[dict[str, str]] = field(default_factory=list)  # workspaces forked from it
    children: list[str] = field(default_factory=list)
    missing: str | None = None  # why there is no manifest (pruned by gc, unreadable)


@dataclass
class History:
    workspace: str
    name: str
    workspaces: list[dict[str, Any]]
    nodes: list[HistoryNode]
    roots: list[str]

    def node(self, cap: str) -> HistoryNode | None:
        return next((n for n in self.nodes if n.capsule == cap), None)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def history(store: WorkspaceStore, ref: str) -> History:
    """The capsule DAG of a workspace and of every workspace forked from it (transitively),
    with the ancestors of its capsules in the workspaces it was forked from."""
    ws = store.resolve(ref)
    inv = Inventory(store)
    inv.load_workspaces()
    inv.list_capsules()
    family = _family(inv, ws)
    belongs = inv.belongs()
    caps = {c for c, owners in belongs.items() if owners & family}
    todo = list(caps)
    while todo:  # every ancestor, whichever workspace wrote it
        m = inv.manifest(todo.pop())
        if m is not None and m.parent and m.parent not in caps:
            caps.add(m.parent)
            todo.append(m.parent)
    forks = inv.fork_points()
    nodes = {c: _node(inv, c, belongs.get(c, set()), forks.get(c, [])) for c in caps}
    for n in nodes.values():
        if n.parent in nodes:
            nodes[n.parent].children.append(n.capsule)
    order = sorted(nodes.values(), key=lambda n: (n.created or "~", n.time or 0.0, n.capsule))
    for n in order:
        n.children.sort(key=lambda c: (nodes[c].created or "~", nodes[c].time or 0.0, c))
    roots = [n.capsule for n in order if n.parent not in nodes]
    rows = []
    for w in sorted((inv.workspaces[x] for x in family), key=lambda w: w.record.created):
        rows.append({"id": w.id, "name": w.name, "state": w.state, "last_capsule": w.last_capsule,
                     "forked_from": w.forked_from, "created": w.record.created})
    return History(ws, inv.workspaces[ws].name, rows, order, roots)


def _family(inv: Inventory, ws: str) -> set[str]:
    family = {ws}
    grew = True
    while grew:
        grew = False
        for w in inv.workspaces.values():
            src = (w.forked_from or {}).get("workspace")
            if src in family and w.id not in family:
                family.add(w.id)
                grew = True
    return family


def _node(inv: Inventory, cap: str, owners: set[str], forked: list[str]) -> HistoryNode:
    m = inv.manifest(cap)
    writer = inv.owner(cap)
    entry: R.CapsuleEntry | None = None
    for w in sorted(owners, key=lambda x: x != writer):  # the writer's own event first
        entry = entry or inv.workspaces[w].named.get(cap)
    label = (m.labels.get(LABEL) if m is not None else None) or {}
    info = (m.labels.get(EXECUTION_LABEL) if m is not None else None) or {}
    allocation = label.get("allocation") or (entry.allocation if entry else None) or None
    machine = None
    if writer in inv.workspaces and allocation:
        a = inv.workspaces[writer].record.allocation(str(allocation))
        machine = f"{a.provider}:{a.machine}" if a is not None else None
    missing = None
    if m is None:
        missing = inv.unreadable.get(cap) or ("pruned by gc" if cap not in inv.listed else "missing")
    return HistoryNode(
        capsule=cap, parent=m.parent if m is not None else (entry.parent if entry else None),
        created=m.created if m is not None else "", time=entry.time if entry else None,
        size=m.size if m is not None else (entry.size if entry else 0),
        reason=(entry.reason if entry else None) or str(info.get("reason") or ("capture" if m is not None else "?")),
        where=(entry.where if entry else None) or str(info.get("where", "")),
        workspace=writer, workspace_name=inv.workspaces[writer].name if writer in inv.workspaces else None,
        allocation=str(allocation) if allocation else None, machine=machine,
        verified=entry.verified if entry else None,
        named_by=sorted(owners),
        last_of=sorted(w for w in owners if inv.workspaces[w].last_capsule == cap),
        forks=[{"workspace": w, "name": inv.workspaces[w].name} for w in sorted(forked)],
        missing=missing,
    )
