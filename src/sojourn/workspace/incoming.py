"""The destination's half of a live move: the incoming supervisor (docs/moves.md).

``python -m sojourn.workspace.incoming --repo URL --workspace WS --move M --allocation B
--epoch E --source A --machine JSON [--in-place DIR] [--files-from CAP]`` is started by the
machine's provider (``sojourn move WS --to MACHINE``: ``LocalProvider.launch``, like ``run
--on MACHINE --detach``) in the allocation's scratch directory. It starts its session warm
(interpreter up under the machine's Python, memory limit and CPUs; the engine and the
program's big libraries imported) and puts the workspace's files in the scratch directory
while it warms up, and only then asks the source to pause. The session's restore of the
move's capsule materializes what changed since (the capsule's own file manifest, small files
first), compares every fingerprint, and waits; this supervisor then takes the epoch by
compare-and-swap and records the commit, with an allocation that names the provider, the
machine, its offer and price, the scratch directory, the hard stop and the handle, exactly
like ``run --on``. ``--in-place DIR`` (``--to local`` or ``--to PYTHON`` of a workspace that
does not run on a machine) runs the session in the workspace's own directory, without files.

Until it wins the epoch it records nothing in the workspace's log.
"""

from __future__ import annotations

import argparse
import os
import queue
import signal
import sys
import time
from typing import TYPE_CHECKING, Any

from sojourn.errors import SojournError
from sojourn.workspace import events as E
from sojourn.workspace import records as R
from sojourn.workspace.errors import AuthorityLost, WorkspaceError
from sojourn.workspace.faults import fault
from sojourn.workspace.liveness import boot_id, hostname, me, process_start
from sojourn.workspace.machine import MachineSpec, spend
from sojourn.workspace.migrate import (
    Heartbeat,
    capsule_entry,
    get_marker,
    lease_seconds,
    poll_interval,
    put_marker,
    verify_timeout,
)
from sojourn.workspace.store import WorkspaceStore

if TYPE_CHECKING:
    from sojourn.workspace.supervisor import Supervisor


class Incoming:
    """The destination's half, run at the start of its supervisor's watcher thread."""

    def __init__(self, sup: Supervisor, move: str, source: str, deadline: float, timeout: float | None,
                 machine: MachineSpec, *, in_place: bool = False, files_from: str | None = None):
        self.sup = sup
        self.move = move
        self.source = source
        self.deadline = deadline
        self.timeout = timeout
        self.machine = machine
        self.in_place = in_place
        self.files_from = files_from  # a snapshot of a workspace that carried no files (ops.moves)
        self.requested = False
        self.expected = sup.spec.epoch
        self.source_alloc: R.Allocation | None = None
        self.lease: Heartbeat | None = None  # renewed from before the ready marker until the commit

    def run(self) -> bool:
        """True once committed (the supervisor carries on as the workspace's holder)."""
        try:
            return self._run()
        except Exception as e:
            if self.sup.committed:  # it runs here now; only the last note was lost
                print(f"sojourn: move {self.move}: {type(e).__name__}: {e}", file=sys.stderr)
                return True
            if self.sup.spec.epoch != self.expected:  # won, but could not record it: leave it to the source
                print(f"sojourn: move {self.move}: won epoch {self.sup.spec.epoch} but could not record it: {e}",
                      file=sys.stderr)
                return self.discard(str(e), tell=False)
            self.discard(str(e) if isinstance(e, SojournError) else f"{type(e).__name__}: {e}")
            return False
        finally:
            if self.lease is not None:
                self.lease.stop()

    def _wait(self, kinds: tuple[str, ...], timeout: float, what: str, check: Any = None) -> dict[str, Any]:
        t_end = time.monotonic() + timeout
        last_check = 0.0
        while True:
            try:
                m = self.sup.inbox.get(timeout=0.01)
            except queue.Empty:
                m = None
            if m is not None:
                if m.get("event") in kinds:
                    return m
                if m.get("event") == "exit":
                    raise SojournError(f"the session ended while {what}: {m.get('error') or ''} "
                                       f"{m.get('message') or ''}".strip())
            elif self.sup._done.is_set():
                tail = self.sup.output.stderr_tail.decode(errors="replace").strip().splitlines()
                raise SojournError(f"the session ended while {what}" + (f": {tail[-1]}" if tail else ""))
            if time.monotonic() > t_end:
                raise SojournError(f"timed out after {timeout:.0f} s {what}")
            if check is not None and time.monotonic() - last_check > 0.05:
                last_check = time.monotonic()
                try:
                    check()
                except _Gone:
                    raise
                except SojournError:
                    pass  # the repository is away for a moment

    def _check_epoch(self) -> None:
        store, ws = self.sup.store, self.sup.spec.workspace
        self._check_lease()
        if not store.holds(ws, self.expected):
            n, doc = store.epoch(ws, self.expected)
            raise _Gone(f"workspace {ws} moved on to epoch {n} ({(doc or {}).get('holder')}); this move is off")

    def _check_lease(self) -> None:
        """A destination that could not renew its lease for ``L/2`` stops: the source may take
        the workspace back at any moment now (the epoch swap keeps that safe; this keeps it
        quick and says why)."""
        lease = self.lease
        if lease is not None and not lease.fresh():
            raise _Gone(f"could not renew its lease (move.{self.sup.spec.workspace}.{self.move}.beat) for "
                        f"{lease.lease / 2:g} s: the repository is out of reach, and the source gives up on a "
                        f"silent destination after {lease.lease:g} s")

    def _files(self) -> None:
        """Put the workspace's files in the scratch directory while the session warms up: its
        last file manifest (or the snapshot ``sojourn move`` took of a workspace that carried
        none). The restore then only writes what the move's capsule changed."""
        if self.in_place:
            return
        from sojourn.workspace import files

        store, s = self.sup.store, self.sup.spec
        rec = store.record(s.workspace, save=False)
        self.source_alloc = rec.allocation(self.source)
        source = self.files_from or str((rec.files or {}).get("capsule") or "") or None
        if source is None:
            return
        try:
            files.materialize(store.repo, source, s.cwd)
        except (SojournError, OSError) as e:
            raise WorkspaceError(f"the workspace's files could not be put in {s.cwd} on machine "
                                 f"{self.machine.name}: {e}") from e

    def _run(self) -> bool:
        sup, store = self.sup, self.sup.store
        s = sup.spec
        ws, move, e = s.workspace, self.move, self.expected
        fault("move.dest.start")
        self._files()
        warm = self._wait(("warm",), 120.0, "starting")
        self.lease = Heartbeat(store, ws, move, lease_seconds())
        self.lease.start()
        put_marker(store, ws, move, "ready", {**me(), "allocation": s.allocation, "python": s.python,
                                               "machine": self.machine.name, "session_pid": warm.get("pid"),
                                               "lease": self.lease.lease})
        fault("move.dest.after-ready")
        self._check_epoch()
        store.request(ws, e, "move", move=move, allocation=s.allocation, deadline=self.deadline,
                      timeout=self.timeout, machine=self.machine.name)
        self.requested = True
        fault("move.dest.after-request")
        src = self._wait_source()
        if src.get("error"):
            return self.discard(f"the source did not pause: {src['error']}", tell=False)
        cap = str(src["capsule"])
        fault("move.dest.after-capsule-seen")
        t_restore = time.monotonic()
        sup._control({"op": "restore", "capsule": cap})
        limit = verify_timeout(int(src.get("size", 0)), self.timeout)
        restored = self._wait(("restored",), limit, f"restoring capsule {cap}", check=self._check_epoch)
        t_restored = time.monotonic()
        fault("move.dest.after-restore")
        from sojourn.workspace.capsules import capsule_facts

        facts = capsule_facts(store.repo, cap)
        entry = capsule_entry({**src, "reason": src.get("reason") or "move"}, self.source, True)
        info = {"reason": f"move {move} from {self.source}", "move": move, "capsule": cap, **me()}
        self._check_lease()  # the last moment: past the swap there is no going back
        new = self._swap(info)
        if new is None:
            return self.discard("the source took the workspace back first", tell=False)
        fault("move.dest.after-cas")
        s.epoch = new
        if self.lease is not None:
            self.lease.stop()  # the epoch says it all from here on
        src_a = self.source_alloc
        from_spend = spend(src_a.price_per_hour, time.time() - src_a.started) if src_a is not None else 0.0
        started = sup.held_started or {}
        self._append_until({"type": "authority", "holder": s.allocation, **info, "from_allocation": self.source,
                            "from_spend": from_spend, "capsule": entry, "distributions": facts.get("distributions"),
                            "arch": facts.get("arch")},
                           {"type": "allocation", "allocation": self._allocation(new, cap)},
                           {"type": "started", "allocation": s.allocation, "session_pid": started.get("pid"),
                            "session_pid_start": started.get("pid_start"),
                            "python_version": started.get("python_version"), "python": started.get("python_version"),
                            "arch": started.get("arch"), "platform": started.get("platform"),
                            "output": started.get("output")})
        fault("move.dest.after-events")
        sup.committed = True
        sup._control({"op": "go", "epoch": new})
        fault("move.dest.after-go")
        sup.start_watchdog()
        try:
            running = self._wait(("running",), 5.0, "starting the program")
            paused = float(running["t"]) - float(src.get("paused_wall") or running["t"])
        except SojournError:
            paused = None
        events: list[dict[str, Any]] = [
            {"type": "move", "move": move, "outcome": "moved", "source": self.source, "destination": s.allocation,
             "capsule": cap, "machine": self.machine.name, "provider": self.machine.provider,
             "paused_ms": round(paused * 1e3, 1) if paused is not None else None,
             "restore_ms": round((t_restored - t_restore) * 1e3, 1), "restore": restored.get("timings")}]
        files_ev = self._files_event(cap)
        if files_ev is not None:
            events.insert(0, files_ev)
        sup.append(*events)
        return True

    def _allocation(self, epoch: int, cap: str) -> dict[str, Any]:
        """The destination's allocation, as ``run --on`` records one (onmachine.attach)."""
        from dataclasses import asdict

        m, s = self.machine, self.sup.spec
        pid = os.getpid()
        started = round(self.sup.t0, 3)  # from the launch: the warm-up is the machine's time too
        scratch = None if self.in_place else s.cwd
        handle = {"provider": m.provider, "machine": m.name, "allocation": s.allocation,
                  "data": {"host": hostname(), "boot_id": boot_id(), "pid": pid, "pid_start": process_start(pid),
                           "scratch": s.cwd}}
        offer = m.offer or ({"provider": m.provider, "name": m.name, "price_per_hour": m.price_per_hour}
                            if not self.in_place else None)
        return asdict(R.Allocation(
            id=s.allocation, provider=m.provider, machine=m.name, host=hostname(), boot_id=boot_id(), pid=pid,
            pid_start=process_start(pid), python=m.python, memory_limit=m.memory, started=started, epoch=epoch,
            capsule_in=cap, price_per_hour=m.price_per_hour, offer=offer, scratch=scratch,
            hard_stop=started + m.max_duration if m.max_duration else None, handle=handle))

    def _files_event(self, cap: str) -> dict[str, Any] | None:
        """The workspace's file manifest from here on: the move's capsule's, or the snapshot's."""
        if self.in_place:
            return None
        from sojourn.workspace.files import files_event_of

        try:
            repo, s = self.sup.store.repo, self.sup.spec
            ev = files_event_of(repo, cap, s.allocation, s.cwd)
            if ev is None and self.files_from:
                ev = files_event_of(repo, self.files_from, s.allocation, s.cwd)
            return ev
        except SojournError:
            return None

    def _append_until(self, *events: dict[str, Any]) -> None:
        """Once the epoch is won there is no going back: retry while the repository is away."""
        t_end = time.monotonic() + 120.0
        while True:
            try:
                self.sup.append(*events, raise_errors=True)
                return
            except SojournError:
                if time.monotonic() > t_end:
                    raise
                time.sleep(0.1)

    def _swap(self, info: dict[str, Any]) -> int | None:
        """The commit: epoch e -> e+1 for this allocation; None when the source took it. A
        write that failed may still have happened (an object store's lost answer): the retry
        then finds epoch e+1 taken by this very allocation."""
        store, s = self.sup.store, self.sup.spec
        t_end = time.monotonic() + 60.0
        while True:
            try:
                return store.acquire(s.workspace, self.expected, s.allocation, **info)
            except AuthorityLost as lost:
                return lost.epoch if lost.holder == s.allocation else None
            except SojournError:
                if time.monotonic() > t_end:
                    raise
                time.sleep(0.1)

    def _wait_source(self) -> dict[str, Any]:
        store, ws, move = self.sup.store, self.sup.spec.workspace, self.move
        t_end = time.monotonic() + self.deadline + 60.0
        poll = poll_interval(store)
        last_check = 0.0
        while True:
            try:
                src = get_marker(store, ws, move, "source")
            except SojournError:  # the repository is away for a moment: keep waiting
                src = None
            if src is not None:
                return src
            if self.sup._done.is_set():
                raise SojournError("the destination's session ended while waiting for the capsule")
            if time.monotonic() - last_check > 0.5:
                last_check = time.monotonic()
                try:
                    self._check_epoch()
                    rec = store.record(ws, save=False)
                except _Gone:
                    raise
                except SojournError:
                    continue
                a = rec.allocation(self.source)
                if a is None or not a.open:
                    raise _Gone(f"the source {self.source} stopped ({a.stop_reason if a else 'unknown'}) before "
                                "it paused for the move")
                from sojourn.workspace.liveness import gone

                why = gone(a)
                if why:
                    raise _Gone(f"the source {self.source} is gone: {why}")
            if time.monotonic() > t_end:
                raise SojournError(f"no capsule from the source within {self.deadline + 60:.0f} s")
            time.sleep(poll)

    def discard(self, why: str, tell: bool = True) -> bool:
        """Give up: nothing of this allocation was recorded, the session is killed. ``tell``:
        the source is told at once (else it notices by the epoch or its own failure)."""
        self.sup.discarded = why
        print(f"sojourn: move {self.move}: destination discarded: {why}", file=sys.stderr)
        if tell:
            try:
                put_marker(self.sup.store, self.sup.spec.workspace, self.move, "dest",
                           {"error": why, "requested": self.requested})
            except SojournError:
                pass
        p = self.sup.proc
        if p is not None and p.returncode is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        return False


class _Gone(SojournError):
    pass


def settle_unstarted(repo_url: str, ws: str, al: str, capsule: str) -> None:
    """An incoming session restored ``capsule`` and lost its supervisor before the go. If that
    supervisor had committed (the record names this allocation as the holder), nothing ran
    here: record the allocation's end, leaving the workspace suspended on the move's capsule
    (a reaper could only say "failed": it cannot know the program never ran)."""
    from sojourn.repository.repo import open_repository

    with open_repository(repo_url) as repo:
        store = WorkspaceStore(repo)
        rec = store.record(ws, save=False)
        a = rec.allocation(al)
        if rec.holder != al or a is None or not a.open:
            return  # not committed (the source settles it), or already recorded
        store.append(ws, rec.epoch, al, E.stop(
            al, "failed", "its supervisor died after the move's commit, before the program ran here; the workspace "
                          f"stands on the move's capsule {capsule}",
            standing=capsule, ran=False, spend=spend(a.price_per_hour, time.time() - a.started)))
        store.record(ws)


def incoming_argv(python: str, *, repo: str, workspace: str, move: str, allocation: str, epoch: int, source: str,
                  machine: MachineSpec, in_place: str | None = None, files_from: str | None = None,
                  deadline: float = 600.0, timeout: float | None = None, preload: list[str] | None = None) -> list[str]:
    """The destination supervisor's command line (``python``: the interpreter sojourn runs
    under on the machine; the session runs under ``machine.python``)."""
    argv = [python, "-m", "sojourn.workspace.incoming", "--repo", repo, "--workspace", workspace, "--move", move,
            "--allocation", allocation, "--epoch", str(epoch), "--source", source, "--machine", machine.dumps(),
            "--deadline", str(deadline)]
    if in_place:
        argv += ["--in-place", in_place]
    if files_from:
        argv += ["--files-from", files_from]
    if timeout:
        argv += ["--timeout", str(timeout)]
    if preload:
        argv += ["--preload", ",".join(preload)]
    return argv


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sojourn.workspace.incoming")
    for name in ("--repo", "--workspace", "--move", "--allocation", "--source", "--machine"):
        p.add_argument(name, required=True)
    p.add_argument("--epoch", type=int, required=True)
    p.add_argument("--in-place", default=None, help="run in this directory, without files (not on a machine)")
    p.add_argument("--files-from", default=None, help="a files-only capsule to put in the scratch directory")
    p.add_argument("--deadline", type=float, default=600.0)
    p.add_argument("--timeout", type=float, default=None)
    p.add_argument("--preload", default="")
    p.add_argument("--scan-interval", type=float, default=600.0)
    ns = p.parse_args(argv)

    from sojourn.repository.repo import open_repository
    from sojourn.workspace.supervisor import SessionSpec, Supervisor

    m = MachineSpec.from_json(ns.machine)
    cwd = ns.in_place or str(m.scratch_for(ns.allocation))
    os.makedirs(cwd, exist_ok=True)
    with open_repository(ns.repo) as repo:
        store = WorkspaceStore(repo)
        spec = SessionSpec(ns.workspace, ns.allocation, ns.epoch, m.python, cwd, memory=m.memory, cpus=m.cpus,
                           hard_stop=m.max_duration, price_per_hour=m.price_per_hour, files=not ns.in_place,
                           scan_interval=ns.scan_interval, incoming=True,
                           preload=[x for x in ns.preload.split(",") if x])
        sup = Supervisor(store, spec)
        sup.incoming = Incoming(sup, ns.move, ns.source, ns.deadline, ns.timeout, m, in_place=bool(ns.in_place),
                                files_from=ns.files_from)
        out = sup.run()
    return out.exit_code


if __name__ == "__main__":
    sys.exit(main())
