"""Warm standby kernels: processes started ahead of need, claimed by the next launch.

A fresh interpreter pays for importing the notebook's libraries (``import torch`` is about
1 s) before a resumed kernel can restore anything, and so does a fresh kernel before its
first cell. A standby pays that ahead of time: the provisioner starts it with the kernel's
python, environment and memory limit; it imports ipykernel, sojourn's restore path and a
list of libraries, says "ready" and waits on a private channel (one end of a socketpair
it inherits, ``$SOJOURN_STANDBY_FD``). A launch that matches claims it: the channel carries
the launch's argv (the connection file), its whole environment and working directory, and
the process continues as the launcher would have started (fresh, ``SOJOURN_RESUME`` or a
move's destination). It is a ``Popen`` child of this process like any kernel it spawns, so
``poll``/``kill``/``wait`` and signals work on it unchanged.

What must be equal for a claim (the pool's key): the python, the memory limit
(``SOJOURN_MEMORY``), the machine, the preload setting, and every environment variable
except those set per launch (``JPY_*`` and :data:`PER_LAUNCH`): a library reads its
environment when it is imported (thread counts, paths; sojourn's own ``SOJOURN_IOPUB_HOLD``
and friends), which in a standby happened before the launch. The standby runs in an
empty directory (nothing of a user's directory is imported by the preload); a launch whose
directory holds a module named like a preloaded library is not given a standby.

A standby whose parent dies sees its channel close and exits. This module runs in the
Jupyter server's process; the standby's own side is ``launcher._wait_as_standby``.
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sojourn.notebook import control

FD_ENV = "SOJOURN_STANDBY_FD"
LAUNCHER = ["-m", "sojourn.notebook.launcher"]
# Set per launch by the provisioner, or read only by the launcher and the extension when the
# kernel starts (after the claim; never at import time: handover.py and autosave.py read
# other SOJOURN_* variables when imported, and those stay in the key): a standby and a launch
# may differ in these.
PER_LAUNCH = frozenset({
    "SOJOURN_KERNEL_CONTROL", "SOJOURN_HANDOFF", "SOJOURN_PRELOAD", "SOJOURN_SPAWNED", "SOJOURN_PREFETCH",
    "SOJOURN_RESUME", "SOJOURN_MACHINE", "SOJOURN_MEMORY", "SOJOURN_STANDBY", "SOJOURN_STANDBY_PRELOAD",
    "SOJOURN_STANDBY_LEARN", FD_ENV, "SOJOURN_WORKSPACE_NAME", "SOJOURN_REPO", "SOJOURN_AUTOSAVE",
    "SOJOURN_AUTOSUSPEND", "SOJOURN_RESUME_ON", "SOJOURN_STANDBY_DELAY"})


def env_key(env: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in env.items() if not k.startswith("JPY_") and k not in PER_LAUNCH))


@dataclass(frozen=True)
class Key:
    python: str
    memory: str  # SOJOURN_MEMORY as the launch has it ("" for none)
    machine: str
    preload: tuple[str, ...] | None  # configured libraries; None: learned (Pool.learn)
    env: tuple[tuple[str, str], ...]


@dataclass
class Standby:
    proc: subprocess.Popen[bytes]
    channel: control.Channel
    preload: tuple[str, ...]
    ready: threading.Event = field(default_factory=threading.Event)


class Pool:
    """Standbys per key, shared by every provisioner of this process. A key's standbys live
    while a kernel that uses the key lives; the last one's shutdown (or this process's
    exit) kills them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: dict[Key, list[Standby]] = {}
        self._users: dict[Key, set[int]] = {}
        self._learned: dict[Key, tuple[str, ...]] = {}
        self._want: dict[Key, int] = {}
        self._base: dict[Key, dict[str, Any]] = {}
        self._filling: set[Key] = set()
        self._dir = tempfile.mkdtemp(prefix="sojourn-standby-")
        atexit.register(self._exit)

    # -- what a launch asks ----------------------------------------------------------------

    def preload_for(self, key: Key) -> tuple[str, ...]:
        if key.preload is not None:
            return key.preload
        with self._lock:
            return self._learned.get(key, ())

    def learn(self, key: Key, names: list[str] | tuple[str, ...], delay: float = 0.0) -> None:
        """A kernel of ``key`` imported these libraries (or a resumed capsule names them):
        standbys preloaded with another list are replaced."""
        if key.preload is not None:
            return
        names = tuple(sorted(set(names)))
        with self._lock:
            if self._learned.get(key) == names:
                return
            self._learned[key] = names
            stale = [s for s in self._idle.get(key, []) if s.preload != names]
            self._idle[key] = [s for s in self._idle.get(key, []) if s.preload == names]
        for s in stale:
            _kill(s)
        self.fill(key, delay)

    def use(self, key: Key, user: int, count: int, base: dict[str, Any]) -> None:
        """``user`` (a provisioner) launches with ``key``; ``count`` standbys are kept for it.
        ``base`` is what a standby is started with (cmd template, env, Popen arguments)."""
        with self._lock:
            self._users.setdefault(key, set()).add(user)
            self._want[key] = max(count, self._want.get(key, 0))
            self._base[key] = base

    def release(self, user: int) -> None:
        """``user`` shut down: the keys nobody uses any more lose their standbys."""
        doomed: list[Standby] = []
        with self._lock:
            for key, users in list(self._users.items()):
                users.discard(user)
                if not users:
                    del self._users[key]
                    doomed += self._idle.pop(key, [])
        for s in doomed:
            _kill(s)

    def claim(self, key: Key, cwd: str | None) -> Standby | None:
        """A live standby of ``key``, taken out of the pool, or None."""
        preload = self.preload_for(key)
        if cwd and _shadowed(cwd, preload):
            return None  # the launch would import the user's module, the standby has the library
        with self._lock:
            idle = self._idle.get(key, [])
            while idle:
                # The one warm longest first: the most likely to have finished its imports.
                s = idle.pop(0)
                if s.proc.poll() is None and s.preload == preload:
                    return s
                _kill(s)
        return None

    def idle(self, key: Key | None = None) -> list[Standby]:
        """The standbys waiting for ``key`` (every key's: None)."""
        with self._lock:
            if key is not None:
                return list(self._idle.get(key, []))
            return [s for ss in self._idle.values() for s in ss]

    def wait_ready(self, exclude: Iterable[int] = (), timeout: float = 120.0) -> Standby:
        """An idle standby that has finished its imports, other than the pids in ``exclude``
        (for tests and benchmarks, which must not time a standby still importing)."""
        skip = set(exclude)
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for s in self.idle():
                if s.ready.is_set() and s.proc.pid not in skip:
                    return s
            time.sleep(0.05)
        raise TimeoutError(f"no standby kernel got ready within {timeout:.0f} s: "
                           f"{[(s.proc.pid, s.proc.poll()) for s in self.idle()]}")

    # -- keeping the pool full -------------------------------------------------------------

    def fill(self, key: Key, delay: float = 0.0) -> None:
        """Start the standbys ``key`` lacks, in a thread (after ``delay`` seconds: the kernel
        just launched gets the CPU for its first moments)."""
        with self._lock:
            if key not in self._users:
                return
        threading.Thread(target=self._fill, args=(key, delay), name="sojourn-standby-fill", daemon=True).start()

    def _fill(self, key: Key, delay: float) -> None:
        if delay > 0:
            time.sleep(delay)
        with self._lock:
            if key in self._filling:
                return  # another thread is topping this key up
            self._filling.add(key)
        try:
            while True:
                with self._lock:
                    idle = self._idle.get(key, [])
                    for s in [s for s in idle if s.proc.poll() is not None]:  # died (an OOM kill...)
                        idle.remove(s)
                    if key not in self._users or len(idle) >= self._want.get(key, 0):
                        return
                    base = self._base[key]
                preload = self.preload_for(key)
                try:
                    s = self._start(key, base, preload)
                except Exception as e:
                    print(f"sojourn: could not start a standby kernel ({type(e).__name__}: {e})", file=sys.stderr)
                    return
                with self._lock:
                    alive = key in self._users
                    current = s.preload == (key.preload if key.preload is not None else self._learned.get(key, ()))
                    if alive and current:
                        self._idle.setdefault(key, []).append(s)
                if not (alive and current):  # its last user shut down, or the list changed, meanwhile
                    _kill(s)
                if not alive:
                    return
        finally:
            with self._lock:
                self._filling.discard(key)

    def _start(self, key: Key, base: dict[str, Any], preload: tuple[str, ...]) -> Standby:
        from jupyter_client.launcher import launch_kernel

        ours, theirs = socket.socketpair()
        env = dict(base["env"])
        env.update({FD_ENV: str(theirs.fileno()), "SOJOURN_PRELOAD": ",".join(preload),
                    "SOJOURN_MACHINE": key.machine})
        env.pop("SOJOURN_MEMORY", None)
        if key.memory:
            env["SOJOURN_MEMORY"] = key.memory
        kw = {k: v for k, v in base["popen"].items() if k not in ("env", "cwd")}
        try:
            proc: subprocess.Popen[bytes] = launch_kernel([key.python, *LAUNCHER], env=env, cwd=self._dir,
                                                          pass_fds=(theirs.fileno(),), **kw)
        finally:
            theirs.close()
        s = Standby(proc, control.Channel(ours), preload)
        threading.Thread(target=_watch_ready, args=(s,), name="sojourn-standby-ready", daemon=True).start()
        return s

    def close(self) -> None:
        """Kill every standby (this process exits, or a test is done)."""
        with self._lock:
            doomed = [s for ss in self._idle.values() for s in ss]
            self._idle.clear()
            self._users.clear()
        for s in doomed:
            _kill(s)

    def _exit(self) -> None:
        self.close()
        shutil.rmtree(self._dir, ignore_errors=True)


def _watch_ready(s: Standby) -> None:
    """The one reader of the pool's end of the channel, and the one to close it: at the
    standby's end (its exit, or after a claim, when it closes its own end)."""
    try:
        if s.channel.recv(timeout=None).get("op") == "ready":
            s.ready.set()
        s.channel.recv(timeout=None)
    except (EOFError, OSError, ValueError):
        pass  # it died or was claimed: a claim sees a death in poll()
    finally:
        s.channel.close()


def _kill(s: Standby) -> None:
    try:
        os.killpg(s.proc.pid, 9)
    except OSError:
        s.proc.kill()
    s.proc.wait()
    for f in (s.proc.stdin, s.proc.stdout, s.proc.stderr):
        if f is not None:
            f.close()


def _shadowed(cwd: str, names: tuple[str, ...]) -> bool:
    return any(os.path.exists(os.path.join(cwd, n + ".py")) or os.path.isdir(os.path.join(cwd, n))
               for n in names)


def assign(s: Standby, argv: list[str], env: dict[str, str], cwd: str, t: float) -> bool:
    """Hand a launch (requested at ``t``) to ``s``: it applies it and becomes that kernel.
    False (and ``s`` is killed) when it cannot take it: the caller starts a kernel as usual."""
    try:
        s.channel.send({"assign": {"argv": argv, "env": env, "cwd": cwd, "t": t}})
        return True
    except OSError:
        _kill(s)
        return False


def capsule_libraries(repo: str | None, resume: str, notebook: str | None) -> list[str]:
    """Top-level modules of the distributions that a capsule to be resumed references (its
    manifest records them): what a standby for such a kernel preloads. Empty when unknown."""
    try:
        from sojourn.capsule import format as fmt
        from sojourn.ops import notebook as nb
        from sojourn.repository.repo import open_repository

        cap = nb.resume_target(repo, resume, notebook)[1]
        if not cap:
            return []
        with open_repository(repo) as r:
            dists = fmt.load_manifest(r, cap).distributions
        return sorted({m for d in dists for m in _modules_of(d)})
    except Exception:
        return []


def _modules_of(dist: str) -> list[str]:
    import importlib.metadata as md

    try:
        d = md.distribution(dist)
    except md.PackageNotFoundError:
        return []
    top = (d.read_text("top_level.txt") or "").split()
    if not top:
        top = sorted({f.parts[0].removesuffix(".py") for f in d.files or []
                      if len(f.parts) > 1 or f.suffix == ".py"} - {"__pycache__"})
        top = [t for t in top if t.isidentifier()]
    return [t for t in top if t.isidentifier() and not t.startswith("_") and t != "sojourn"]


_POOL: Pool | None = None
_POOL_LOCK = threading.Lock()


def pool() -> Pool:
    """This process's pool (made on first use: a kernel process never has one)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = Pool()
        return _POOL


def report_libraries(shell: Any) -> None:
    """In a kernel whose pool learns its preload: after a cell that imported something,
    tell the provisioner which libraries this kernel has (the next standby imports them)."""
    from sojourn.notebook.handover import installed_packages

    seen: dict[str, Any] = {"modules": -1, "sent": None}

    def post(*args: Any) -> None:
        if len(sys.modules) == seen["modules"]:
            return  # nothing was imported: the usual cell costs one len()
        seen["modules"] = len(sys.modules)
        names = installed_packages()
        if names != seen["sent"]:
            seen["sent"] = names
            threading.Thread(target=_send_libraries, args=(names,), name="sojourn-libraries", daemon=True).start()

    shell.events.register("post_run_cell", post)


def _send_libraries(names: list[str]) -> None:
    try:
        ch = control.connect(timeout=5)
        try:
            ch.send({"op": "libraries", "names": names})
        finally:
            ch.close()
    except Exception:
        pass  # only a later standby's warmth is lost
