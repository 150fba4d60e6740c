"""``local``: the machines of the repository's machines config, on this host.

Each allocation is its own process tree (its own session and process group) in its own
scratch directory, ``$SOJOURN_HOME/machines/<machine>/<allocation>/``. What a launch starts
is named by (host, boot id, pid, start time), so ``status`` and ``terminate`` work from any
process on this host and never mistake a reused pid for it.

The machine's limits are the session's: the supervisor that a launch starts passes them on
(``RLIMIT_DATA`` for memory, ``sched_setaffinity`` for cpus; see ``workspace/session.py``),
and its watchdog enforces the hard stop by suspending the session. The supervisor itself runs
unlimited under this interpreter, so that it can always record how the allocation ended.
"""

from __future__ import annotations

import os
import platform
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from sojourn.providers.base import (
    Handle,
    LaunchFailed,
    LaunchSpec,
    Offer,
    Requirements,
    Status,
    cheapest_first,
)
from sojourn.providers.machines import Machine, get_machine, load_machines, machine_interpreter
from sojourn.repository.repo import Repository
from sojourn.workspace.capsules import child_env
from sojourn.workspace.liveness import boot_id, hostname, process_start
from sojourn.workspace.machine import scratch_dir

# Popen objects of what this process launched: polled so that they do not stay zombies.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def total_memory() -> int | None:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def usable_cpus() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _arch() -> str:
    a = platform.machine().lower()
    return {"amd64": "x86_64", "aarch64": "arm64"}.get(a, a)


class LocalProvider:
    """The configured machines of ``repo`` as offers; launches as local process trees."""

    name = "local"
    terminate_grace = 60.0  # seconds between SIGTERM (the session pauses) and SIGKILL

    def __init__(self, repo: Repository):
        self.repo = repo

    # -- offers --------------------------------------------------------------------------------

    def offer_of(self, m: Machine) -> Offer:
        interp = machine_interpreter(m)
        host_mem = total_memory()
        memory = m.memory if m.memory is not None else host_mem
        cpus = min(m.cpus, usable_cpus()) if m.cpus else usable_cpus()
        return Offer(provider=self.name, name=m.name, cpus=cpus, memory=memory, arch=_arch(),
                     region=hostname(), price_per_hour=m.price_per_hour, python=interp.path or m.python,
                     extra={"python_version": interp.version, "python_error": interp.error,
                            "memory_limit": m.memory, "max_duration": m.max_duration, "host": hostname()})

    def offers(self, req: Requirements) -> list[Offer]:
        out = []
        for m in load_machines(self.repo).values():
            if m.provider != self.name:
                continue
            offer = self.offer_of(m)
            if not offer.fits(req):
                continue
            version = offer.extra.get("python_version")
            if req.python and not (version and (version == req.python or version.startswith(req.python + "."))):
                continue
            out.append(offer)
        return cheapest_first(out)

    def offer(self, name: str) -> Offer:
        m = get_machine(self.repo, name)
        if m.provider != self.name:
            raise LaunchFailed(f"machine {name!r} is provided by {m.provider!r}, not {self.name!r}", "catalog")
        return self.offer_of(m)

    # -- launch, status, terminate -------------------------------------------------------------

    def launch(self, offer: Offer, spec: LaunchSpec) -> Handle:
        """Start ``spec.argv`` as a detached process tree in the allocation's scratch
        directory; its stdout and stderr go to ``<scratch>.log`` beside it."""
        if offer.provider != self.name:
            raise LaunchFailed(f"offer {offer.name!r} is from provider {offer.provider!r}, not {self.name!r}",
                               "catalog")
        if not spec.argv:
            raise LaunchFailed("nothing to launch: the command line is empty", "launch")
        scratch = Path(spec.cwd) if spec.cwd else scratch_dir(offer.name, spec.allocation)
        log = scratch.parent / f"{scratch.name}.log"
        try:
            scratch.mkdir(parents=True, exist_ok=True)
            out = open(log, "ab")  # noqa: SIM115 (the child holds it; closed here once started)
        except OSError as e:
            raise LaunchFailed(f"cannot create the scratch directory {scratch}: {e.strerror or e}", "launch") from e
        env = child_env()
        env.update(spec.env)
        try:
            with out:
                proc = subprocess.Popen(spec.argv, cwd=scratch, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                        stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as e:
            raise LaunchFailed(f"cannot start {spec.argv[0]} on machine {offer.name}: {e.strerror or e}",
                               "launch") from e
        _CHILDREN[proc.pid] = proc
        data: dict[str, Any] = {"host": hostname(), "boot_id": boot_id(), "pid": proc.pid,
                                "pid_start": process_start(proc.pid), "scratch": str(scratch), "log": str(log),
                                "hard_stop": time.time() + spec.hard_stop if spec.hard_stop else None}
        return Handle(self.name, offer.name, spec.allocation, data)

    def _mine(self, handle: Handle) -> bool:
        d = handle.data
        if d.get("host") != hostname():
            return False
        return not (d.get("boot_id") and boot_id() and d.get("boot_id") != boot_id())

    def status(self, handle: Handle) -> Status:
        d = handle.data
        if not self._mine(handle):
            # Another boot of this host: everything it ran is gone. Another host: not ours to say.
            return "ended" if d.get("host") == hostname() else "unknown"
        _reap(int(d.get("pid") or 0))
        return "running" if _alive(d.get("pid"), d.get("pid_start")) else "ended"

    def terminate(self, handle: Handle, grace: float | None = None) -> None:
        """SIGTERM to the process group (a sojourn supervisor forwards it: the session pauses),
        then, after ``grace`` seconds, SIGKILL to every process of the tree still there."""
        if not self._mine(handle):
            if handle.data.get("host") != hostname():
                from sojourn.providers.base import ProviderError

                raise ProviderError(f"allocation {handle.allocation} runs on {handle.data.get('host')}, not on this "
                                    f"host ({hostname()}): terminate it there")
            return
        pid, start = int(handle.data.get("pid") or 0), handle.data.get("pid_start")
        if not _alive(pid, start):
            _reap(pid)
            return
        tree = [(p, process_start(p)) for p in [pid, *_descendants(pid)]]
        _signal_group(pid, signal.SIGTERM)
        deadline = time.monotonic() + (self.terminate_grace if grace is None else grace)
        while time.monotonic() < deadline:
            _reap(pid)
            if not any(_alive(p, s) for p, s in tree):
                return
            time.sleep(0.05)
        known = {p for p, _ in tree}
        tree += [(p, process_start(p)) for p in _descendants(pid) if p not in known]  # started since
        for p, s in tree:
            if _alive(p, s):
                _signal_group(p, signal.SIGKILL)
                _kill(p, s)
        # SIGKILL is delivered asynchronously: return once the tree is gone, so that a status
        # right after says "ended".
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            _reap(pid)
            if not any(_alive(p, s) for p, s in tree):
                break
            time.sleep(0.02)


def _alive(pid: Any, start: Any) -> bool:
    if not pid:
        return False
    now = process_start(int(pid))
    if now is None:
        return False
    return start is None or now == start


def _reap(pid: int) -> None:
    p = _CHILDREN.get(pid)
    if p is not None and p.poll() is not None:
        del _CHILDREN[pid]


def _signal_group(pid: int, sig: int) -> None:
    # Only a group that this process leads: never a group that the pid merely joined.
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _kill(pid: int, start: int | None) -> None:
    if _alive(pid, start):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _descendants(root: int) -> list[int]:
    """Every process below ``root`` (a sojourn session is in its own group, not the
    supervisor's, so killing the group alone would leave it)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for name in entries:
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(name))
    out, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out
