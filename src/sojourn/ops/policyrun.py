"""The policy watcher: ``python -m sojourn.ops.policyrun --repo URL --workspace WS``.

Why a process of its own, in the ops layer, rather than a thread of the supervisor: the
workspace layer (the supervisor) may not import the router, the providers or ops, and a
policy's action is an ops call (``move``, ``resume``). And a workspace outlives its
supervisors: after a move the program runs under another one (the move's destination),
after an out-of-memory stop under none. The watcher follows the *workspace*, not one
allocation: it reads the event log, evaluates the policies every ``interval`` while the
workspace runs, records each decision that changed, carries out the ones a setting
switched on (``move``), settles an out-of-memory stop (``resume`` with ``oom=perform``), and
exits once the workspace stands still (finished, suspended, failed).

At most one watcher runs per workspace: ``policy.<ws>.watcher`` names it (host, boot id, pid,
start time); a starter that finds a live one starts nothing. It runs where it was started
(the host that typed ``run``/``resume``/``policy set``).

The GPU sampler is injectable (``Watcher(sampler=...)``): by default ``nvidia-smi``'s
utilization of this host's GPUs, which is the session's only when the session runs on this
host (provider ``local``); elsewhere the GPU-idle policy gets no samples and stays quiet.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sojourn.ops import policy as P

if TYPE_CHECKING:
    from sojourn.providers.base import Offer
    from sojourn.router.policy import Decision
    from sojourn.workspace.store import WorkspaceStore

Sampler = Callable[[], "float | None"]  # GPU utilization in percent; None: no GPU to look at
BUSY_PERCENT = 5.0  # above this the GPU counts as busy


def nvidia_smi_utilization() -> float | None:
    """The highest utilization (percent) of this host's GPUs, from ``nvidia-smi``; None when
    there is no ``nvidia-smi`` or it does not answer."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        p = subprocess.run([exe, "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=10, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    values = []
    for line in p.stdout.splitlines():
        try:
            values.append(float(line.strip()))
        except ValueError:
            continue
    return max(values) if p.returncode == 0 and values else None


class GpuIdle:
    """How long the GPU has been idle, from samples: the time since the first idle sample of
    the current idle stretch (0 while busy, or when there is no GPU)."""

    def __init__(self, sampler: Sampler, *, busy_percent: float = BUSY_PERCENT,
                 clock: Callable[[], float] = time.monotonic):
        self.sampler = sampler
        self.busy_percent = busy_percent
        self.clock = clock
        self.idle_since: float | None = None
        self.last: float | None = None

    def sample(self) -> float:
        u = self.sampler()
        self.last = u
        now = self.clock()
        if u is None or u > self.busy_percent:
            self.idle_since = None
            return 0.0
        if self.idle_since is None:
            self.idle_since = now
        return now - self.idle_since

    @property
    def idle_s(self) -> float:
        return 0.0 if self.idle_since is None else self.clock() - self.idle_since


class Watcher:
    """Evaluates a workspace's policies while it runs and settles an out-of-memory stop.
    ``sampler``, ``offers`` and ``clock`` are injectable (tests; no GPU on the build hosts)."""

    def __init__(self, repo: str, workspace: str, *, sampler: Sampler | None = None,
                 offers: Callable[[], list[Offer]] | None = None, poll: float | None = None,
                 clock: Callable[[], float] = time.time, by: str = "policy:watcher"):
        self.repo = repo
        self.workspace = workspace
        self.gpu = GpuIdle(sampler or nvidia_smi_utilization)
        self.offers_fn = offers
        self.poll = poll
        self.clock = clock
        self.by = by
        self.events: list[dict[str, Any]] = []
        self.cursor = 0
        self.settings = P.Settings()
        self.last: dict[str, dict[str, Any]] = {}  # policy -> its last recorded decision
        self.last_eval = float("-inf")
        self.last_sample = float("-inf")

    # -- reading the log -------------------------------------------------------------------

    def _read(self, store: WorkspaceStore) -> None:
        new = store.events(self.workspace, self.cursor + 1)
        for ev in new:
            self.cursor = int(ev["seq"])
            if ev.get("type") == P.DECISION_EVENT:
                self.last[str(ev.get("policy"))] = ev
        self.events += new
        self.settings = P.settings_of(new, self.settings)

    def _offers(self, store: WorkspaceStore) -> list[Offer]:
        if self.offers_fn is not None:
            return self.offers_fn()
        return P.machine_offers(store.repo)[0]

    # -- one evaluation ------------------------------------------------------------------------

    def tick(self, store: WorkspaceStore) -> list[Decision]:
        """Evaluate the running policies once: record what changed, carry out a ``move``."""
        self._read(store)
        rec = store.record(self.workspace, save=False)
        if rec.state != "running" or rec.current is None or rec.pending is not None:
            return []  # starting, stopping or serving a request: judge it once it settles
        offers = self._offers(store)
        s = P.situation(rec, self.events, self.settings, offers, gpu_idle_s=self.gpu.idle_s, now=self.clock())
        decisions = P.decide_now(s, offers, self.settings)
        for d in decisions:
            if not P.changed(d, self.last.get(d.policy)):
                continue
            ev = P.decision_event(d, rec.current.id)
            P.record(store, self.workspace, rec.epoch, self.by, ev)
            self.last[d.policy] = ev
            if d.action == "move" and d.target is not None:
                self._move(store, d, ev)
                break  # one action per evaluation; the next one sees where it runs now
        return decisions

    def _move(self, store: WorkspaceStore, d: Decision, ev: dict[str, Any]) -> None:
        from sojourn.ops.moves import move

        machine = ev.get("machine")
        try:
            res = move(self.workspace, str(machine), repo=store.repo.url)
            moved = res.moved or self._settled(store, res.move)
            outcome, extra = ("moved" if moved else "not-moved"), {"move": res.move, "message": res.message,
                                                                  "paused_ms": res.paused_ms}
        except Exception as e:  # a move that cannot start leaves the program where it runs
            outcome, extra = "error", {"message": str(e)}
        P.record(store, self.workspace, 0, self.by,
                 {"type": P.RESULT_EVENT, "policy": d.policy, "action": d.action, "target": ev.get("target"),
                  "machine": machine, "outcome": outcome, **extra})
        # After a move, the next decision is against the new machine: forget the last one.
        self.last.pop(d.policy, None)

    def _settled(self, store: WorkspaceStore, move_id: str, timeout: float = 10.0) -> bool:
        """Whether move ``move_id`` committed, by its ``move`` event (the command may answer
        before the destination's events are in the log: the source's stop comes first)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for ev in reversed(store.events(self.workspace, self.cursor + 1)):
                if ev.get("type") == "move" and ev.get("move") == move_id:
                    return ev.get("outcome") == "moved"
            time.sleep(0.1)
        return False

    def settle(self, store: WorkspaceStore) -> bool:
        """The workspace stopped: settle an out-of-memory stop. True when it runs again (the
        policy resumed it), so the watcher goes on."""
        h = P.settle_oom(store, self.workspace, by=self.by)
        if h is None or not h.claimed or h.decision is None or h.decision.action != "resume" or not h.machine:
            return False
        from sojourn.ops.workspaces import resume

        try:
            d = resume(self.workspace, repo=store.repo.url, on=h.machine, detach=True)
            outcome, extra = "resumed", {"allocation": getattr(d, "allocation", None)}
        except Exception as e:
            outcome, extra = "error", {"message": str(e)}
        P.record(store, self.workspace, 0, self.by,
                 {"type": P.RESULT_EVENT, "policy": "oom", "action": "resume", "machine": h.machine,
                  "outcome": outcome, **extra})
        return outcome == "resumed"

    # -- the loop ----------------------------------------------------------------------------

    def run(self) -> int:
        from sojourn.repository.repo import open_repository
        from sojourn.workspace.authority import reap
        from sojourn.workspace.store import WorkspaceStore

        with open_repository(self.repo) as repo:
            store = WorkspaceStore(repo)
            if not claim(store, self.workspace):
                return 0
            poll = self.poll or (1.0 if type(store.backend).__name__ == "S3Backend" else 0.25)
            try:
                while True:
                    self._read(store)
                    rec = reap(store, store.record(self.workspace), by="policy watcher")
                    if rec.state == "running":
                        if not self.settings.watch:
                            return 0  # switched off
                        now = time.monotonic()
                        if now - self.last_sample >= min(5.0, self.settings.interval_s):
                            self.last_sample = now
                            self.gpu.sample()
                        if now - self.last_eval >= self.settings.interval_s:
                            self.last_eval = now
                            self.tick(store)
                    elif not self.settle(store):
                        return 0
                    time.sleep(poll)
            finally:
                release(store, self.workspace)


# -- one watcher per workspace -----------------------------------------------------------------


def _marker(ws: str) -> str:
    return f"policy.{ws}.watcher"


def watcher_info(store: WorkspaceStore, ws: str) -> dict[str, Any] | None:
    """The live watcher of ``ws`` (host, pid...), or None."""
    from sojourn.errors import ObjectNotFound
    from sojourn.workspace.liveness import alive, boot_id, hostname
    from sojourn.workspace.store import KIND

    try:
        doc = json.loads(store.backend.load(KIND, _marker(ws)))
    except (ObjectNotFound, ValueError):
        return None
    if doc.get("host") == hostname() and doc.get("boot_id") == boot_id() and not alive(doc.get("pid"),
                                                                                    doc.get("pid_start")):
        return None
    return dict(doc)


def claim(store: WorkspaceStore, ws: str) -> bool:
    """Make this process the workspace's watcher, unless another live one is."""
    from sojourn.workspace.liveness import me
    from sojourn.workspace.store import KIND

    doc = watcher_info(store, ws)
    if doc is not None and doc.get("pid") != os.getpid():
        return False
    store.backend.save(KIND, _marker(ws), json.dumps(me()).encode())
    store.backend.flush()
    return True


def release(store: WorkspaceStore, ws: str) -> None:
    from sojourn.errors import RepositoryError
    from sojourn.workspace.store import KIND

    doc = watcher_info(store, ws)
    if doc is not None and doc.get("pid") == os.getpid():
        try:
            store.backend.remove(KIND, _marker(ws))
            store.backend.flush()
        except RepositoryError:
            pass


def ensure_watcher(store: WorkspaceStore, ws: str) -> int | None:
    """Start a detached watcher for ``ws`` unless a live one runs; its pid (None: one ran)."""
    from sojourn.repository.repo import sojourn_home
    from sojourn.workspace.capsules import child_env
    from sojourn.workspace.liveness import boot_id, hostname, process_start
    from sojourn.workspace.store import KIND

    if watcher_info(store, ws) is not None:
        return None
    log = sojourn_home() / "policy" / f"{ws}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "sojourn.ops.policyrun", "--repo", store.repo.url,
                                 "--workspace", ws], env=child_env(), stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True, cwd="/")
    # Named at once, so that a second starter right after does not start another.
    store.backend.save(KIND, _marker(ws), json.dumps({"host": hostname(), "boot_id": boot_id(), "pid": proc.pid,
                                                      "pid_start": process_start(proc.pid)}).encode())
    store.backend.flush()
    return proc.pid


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sojourn.ops.policyrun")
    parser.add_argument("--repo", required=True)
    parser.add_argument("--workspace", required=True)
    parser.add_argument("--poll", type=float, default=None, help="seconds between reads of the workspace's log")
    ns = parser.parse_args(argv)
    from sojourn.errors import SojournError

    try:
        return Watcher(ns.repo, ns.workspace, poll=ns.poll).run()
    except SojournError as e:
        print(f"sojourn: policy watcher of {ns.workspace}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
