"""The sojourn kernel provisioner: one Jupyter kernel id, any number of processes over time.

Jupyter's KernelManager knows a kernel by its id, its connection file (ports, key) and its
provisioner; it asks the provisioner whether the kernel lives (``poll``), and to signal,
kill or wait for it. This provisioner is the LocalProvisioner plus a control channel (a
Unix socket the kernel finds in ``$SOJOURN_KERNEL_CONTROL``) on which a kernel asks to move:

1. start the destination process on the chosen machine (same connection file, so the same
   ports and key; the machine's python and memory limit);
2. pass it the capsule the source wrote; it restores and checks it and says ready (or
   why not: then it is killed, the source is told, and nothing else changes);
3. follow the destination from now on (``process``, ``pid``, ``pgid``: ``poll``/``kill``/
   ``wait``/``send_signal``/interrupts all go to it), then tell the source to release;
4. once the source has exited (its ports are free), tell the destination to bind them.

The restarter polls ``poll()`` every few seconds: it only ever sees the destination, which
was swapped in while the source was still alive, so a move never looks like a death.

With ``standby`` > 0 a launch (and a move's destination) takes a warm standby process when
one matches (``standby.py``): the pool lives in this process, shared by its provisioners.

Registered under the ``jupyter_client.kernel_provisioners`` entry point as
``sojourn-provisioner``; the ``sojourn`` kernelspec names it in its metadata, with
``config`` keys that become this class's traits (machine, repo, autosave).
"""

from __future__ import annotations

import json
import os
import secrets
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from jupyter_client.launcher import launch_kernel
from jupyter_client.provisioning import LocalProvisioner
from traitlets import Bool, Float, Int, List, Unicode

from sojourn.notebook import control
from sojourn.notebook import standby as warm
from sojourn.notebook.prefetch import ENV as PREFETCH_ENV


class _Slot:
    """Where a destination's hello connection waits for the move that started it."""

    def __init__(self) -> None:
        self.channel: control.Channel | None = None
        self.arrived = threading.Event()
        self.finished = threading.Event()


class SojournProvisioner(LocalProvisioner):  # type: ignore[misc]
    machine = Unicode("local", config=True, help="the machine a new kernel starts on")
    repo = Unicode("", config=True, help="the sojourn repository (default: $SOJOURN_REPO or ~/.sojourn/repo)")
    autosave = Bool(False, config=True, help="a capsule after every cell from the first one")
    autosuspend = Unicode("", config=True, help="suspend the kernel after this long idle (30m, 90s; empty: never)")
    resume_on = Unicode("", config=True, help="the machine a suspended kernel resumes on (default: its last)")
    resume = Unicode("", config=True, help="a workspace (or capsule) a new kernel starts from; 'notebook': "
                     "the suspended workspace of the notebook, when there is one")
    standby = Int(0, config=True, help="warm standby kernels kept ready for launches like this one "
                  "(env SOJOURN_STANDBY overrides; 0: none). Each costs a process with its libraries "
                  "imported (with torch: ~230 MB)")
    standby_preload = List(Unicode(), config=True, help="libraries a standby imports (env "
                           "SOJOURN_STANDBY_PRELOAD, comma-separated); empty: learned from the last "
                           "kernel's imports and from capsules being resumed")
    standby_delay = Float(1.0, config=True, help="seconds after a launch before its replacement standby "
                          "starts (the new kernel gets the CPU first; env SOJOURN_STANDBY_DELAY)")

    _server: control.Server | None = None
    _standby_key_used: warm.Key | None = None  # the pool key of this kernel's launches
    _dir: str | None = None

    # -- launch ---------------------------------------------------------------------------------

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        kwargs = await super().pre_launch(**kwargs)
        self._close_control()
        self._slots: dict[str, _Slot] = {}
        self._suspended: dict[str, Any] | None = None
        self._pending: set[subprocess.Popen[bytes]] = set()
        self._lock = threading.Lock()
        self._dir = tempfile.mkdtemp(prefix="sojourn-kernel-")
        self._server = control.Server(os.path.join(self._dir, "control.sock"), self._serve)
        env = dict(kwargs.get("env") or os.environ)
        env[control.ENV] = self._server.path
        env.setdefault("SOJOURN_MACHINE", self.machine)
        if self.repo:
            env.setdefault("SOJOURN_REPO", self.repo)
        if self.autosave:
            env.setdefault("SOJOURN_AUTOSAVE", "1")
        for key, value in (("SOJOURN_AUTOSUSPEND", self.autosuspend), ("SOJOURN_RESUME_ON", self.resume_on),
                           ("SOJOURN_RESUME", self.resume)):
            if value:
                env.setdefault(key, value)
        if self._standby_count(env) > 0 and not self._standby_preload(env):
            env["SOJOURN_STANDBY_LEARN"] = "1"  # the kernel tells which libraries it imported
        kwargs["env"] = env
        self._cmd = list(kwargs["cmd"])
        self._launch = {k: v for k, v in kwargs.items() if k != "cmd"}
        return kwargs

    # -- warm standbys (standby.py) --------------------------------------------------------------

    def _standby_count(self, env: dict[str, str]) -> int:
        text = env.get("SOJOURN_STANDBY", "").strip()
        try:
            return int(text) if text else int(self.standby)
        except ValueError:
            return int(self.standby)

    def _standby_preload(self, env: dict[str, str]) -> tuple[str, ...]:
        text = env.get("SOJOURN_STANDBY_PRELOAD", "")
        return tuple(self.standby_preload) or tuple(n.strip() for n in text.split(",") if n.strip())

    def _standby_delay(self, env: dict[str, str]) -> float:
        try:
            return float(env.get("SOJOURN_STANDBY_DELAY") or self.standby_delay)
        except ValueError:
            return float(self.standby_delay)

    def _standby_key(self, python: str, env: dict[str, str], memory: str, machine: str) -> warm.Key:
        return warm.Key(python, memory, machine, self._standby_preload(env) or None, warm.env_key(env))

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> Any:
        proc = self._claim_for_launch(cmd, kwargs)
        if proc is None:
            return await super().launch_kernel(cmd, **kwargs)
        self.process, self.pid = proc, proc.pid
        try:
            self.pgid = os.getpgid(proc.pid)
        except OSError:
            self.pgid = None
        self.cwd = kwargs.get("cwd") or os.getcwd()
        return self.connection_info

    def _claim_for_launch(self, cmd: list[str], kwargs: dict[str, Any]) -> subprocess.Popen[bytes] | None:
        """A standby that becomes this launch's kernel, or None (then it starts as always).
        Either way the pool is (re)filled for the next launch like this one."""
        t = time.time()
        env = dict(kwargs.get("env") or os.environ)
        count = self._standby_count(env)
        if count <= 0 or cmd[1:3] != warm.LAUNCHER or kwargs.get("independent") or any(
                kwargs.get(k) is not None for k in ("stdin", "stdout", "stderr")):
            return None  # not the sojourn launcher, or streams a standby was not started with
        key = self._standby_key(cmd[0], env, env.get("SOJOURN_MEMORY", ""), env.get("SOJOURN_MACHINE", self.machine))
        pool = warm.pool()
        base = {k: v for k, v in env.items() if not k.startswith("JPY_") and k not in warm.PER_LAUNCH}
        pool.use(key, id(self), count, {"env": base, "popen": {}})
        self._standby_key_used = key
        cwd = str(kwargs.get("cwd") or os.getcwd())
        s = pool.claim(key, cwd)
        if env.get("SOJOURN_RESUME") and key.preload is None:  # the next one preloads this capsule's libraries
            libs = warm.capsule_libraries(env.get("SOJOURN_REPO") or None, env["SOJOURN_RESUME"],
                                          env.get("JPY_SESSION_NAME") or None)
            if libs:
                pool.learn(key, sorted({*pool.preload_for(key), *libs}), self._standby_delay(env))
        pool.fill(key, self._standby_delay(env))
        if s is None:
            return None
        env["JPY_PARENT_PID"] = str(os.getpid())  # what launch_kernel sets for a kernel it starts
        return s.proc if warm.assign(s, list(cmd[3:]), env, cwd, t) else None

    def _claim_for_spawn(self, cmd: list[str], env: dict[str, str], kw: dict[str, Any],
                         memory: int | None, machine: str) -> subprocess.Popen[bytes] | None:
        """A move's (or resume's) destination from the standbys of a launch key in use."""
        if cmd[1:3] != warm.LAUNCHER or self._standby_count(env) <= 0 or any(
                kw.get(k) is not None for k in ("stdin", "stdout", "stderr")):
            return None
        key = self._standby_key(cmd[0], env, str(memory or ""), machine)
        pool = warm.pool()
        cwd = str(kw.get("cwd") or os.getcwd())
        s = pool.claim(key, cwd)
        pool.fill(key, self._standby_delay(env))  # only a key some launch uses is kept warm
        if s is None:
            return None
        env = {**env, "JPY_PARENT_PID": str(os.getpid())}
        return s.proc if warm.assign(s, list(cmd[3:]), env, cwd, time.time()) else None

    def _spawn(self, python: str, memory: int | None, machine: str, token: str,
               preload: list[str], stand_in: bool = False, prefetch: Any = None) -> subprocess.Popen[bytes]:
        cmd = list(self._cmd)
        cmd[0] = python  # the kernelspec's argv starts with the interpreter
        if stand_in:  # the suspended kernel's stand-in runs where the server runs, with its python
            cmd = [sys.executable, "-m", "sojourn.notebook.stub", "-f", self._connection_file()]
        kw = LocalProvisioner._scrub_kwargs(dict(self._launch))
        env = dict(kw.get("env") or os.environ)
        env.update(SOJOURN_HANDOFF=token, SOJOURN_MACHINE=machine, SOJOURN_PRELOAD=",".join(preload),
                   SOJOURN_SPAWNED=repr(time.time()))
        env.pop(PREFETCH_ENV, None)
        if prefetch and prefetch.get("capsule") and not stand_in:
            # the previous capsule: the destination reads it while the source captures
            env[PREFETCH_ENV] = json.dumps(prefetch)
        env.pop("SOJOURN_MEMORY", None)
        env.pop("SOJOURN_RESUME", None)  # a destination restores what it is sent, nothing else
        if memory:
            env["SOJOURN_MEMORY"] = str(memory)
        kw["env"] = env
        proc = None if stand_in else self._claim_for_spawn(cmd, env, kw, memory, machine)
        if proc is None:
            proc = launch_kernel(cmd, **kw)
        with self._lock:
            self._pending.add(proc)
        return proc

    def _connection_file(self) -> str:
        cf = getattr(self.parent, "connection_file", None)
        if cf:
            return str(cf)
        return str(self._cmd[self._cmd.index("-f") + 1])

    # -- the control channel ---------------------------------------------------------------------

    def _serve(self, ch: control.Channel) -> None:
        # No time limit: a suspending kernel connects before its capture and verify (which take
        # as long as the state is large) and speaks after them; a peer that dies closes the socket.
        msg = ch.recv(timeout=None)
        op = msg.get("op")
        if op == "move":  # a kernel moves: the destination restores the capsule the source sends next
            self._relocate(ch, msg, plan=None, stand_in=False)
        elif op == "suspend":  # a kernel suspends: a stand-in holds the ports
            self._relocate(ch, msg, plan=msg["plan"], stand_in=True)
        elif op == "wake":  # the stand-in got a request: resume on the chosen machine
            with self._lock:
                held = self._suspended
            if held is None:
                ch.send({"status": "failed", "error": "this kernel is not suspended"})
                return
            self._relocate(ch, held["target"], plan=held["plan"]["plan"], stand_in=False)
        elif op == "libraries":  # what the kernel imported: the next standbys preload it
            key = self._standby_key_used
            if key is not None:
                warm.pool().learn(key, [str(n) for n in msg.get("names") or []])
        elif op == "hello":
            slot = self._slots.get(str(msg.get("token")))
            if slot is None:
                return
            slot.channel = ch
            slot.arrived.set()
            slot.finished.wait()  # the move talks to it; keep the connection open until then

    def _relocate(self, ch: control.Channel, target: dict[str, Any], *, plan: dict[str, Any] | None,
                  stand_in: bool) -> None:
        """Start the next process of this kernel, let it get ready while ``ch``'s process (the
        kernel, or the stand-in) still owns the ports, then swap: the next process is
        followed, the current one hands over and exits, the next one binds the ports."""
        token = secrets.token_hex(8)
        slot = self._slots[token] = _Slot()
        proc = None
        try:
            try:
                proc = self._spawn(str(target.get("python") or sys.executable), target.get("memory"),
                                   str(target.get("machine") or self.machine), token,
                                   target.get("preload") or [], stand_in=stand_in,
                                   prefetch=target.get("prefetch") if plan is None else None)
                while not slot.arrived.wait(0.1):
                    if proc.poll() is not None:
                        raise RuntimeError(f"the destination process exited at start (code {proc.returncode})")
                    if _closed(ch):
                        raise RuntimeError("the kernel gave up the move")
                assert slot.channel is not None
                if stand_in:
                    slot.channel.send({"stand_in": plan})
                else:
                    if plan is None:
                        plan = ch.recv(timeout=None)  # the source's capsule, once written
                    slot.channel.send({"restore": plan})
                while True:
                    try:
                        res = slot.channel.recv(timeout=1.0)
                        break
                    except TimeoutError:
                        if proc.poll() is not None:
                            raise RuntimeError(f"the destination process died while restoring "
                                               f"(exit code {proc.returncode})") from None
                        if _closed(ch):  # Ctrl-C or its own time limit: it stays the kernel
                            raise RuntimeError("the kernel gave up the move") from None
                if res.get("op") != "ready":
                    raise RuntimeError(str(res.get("error") or res))
            except Exception as e:
                if proc is not None:
                    self._discard(proc)
                try:
                    ch.send({"status": "failed", "error": f"{e}"})
                except OSError:
                    pass
                return
            # Commit: from here on Jupyter follows the next process.
            old, old_pgid = self.process, getattr(self, "pgid", None)
            self.process, self.pid = proc, proc.pid
            try:
                self.pgid = os.getpgid(proc.pid)
            except OSError:
                self.pgid = None
            with self._lock:
                self._pending.discard(proc)
                self._suspended = {"target": target, "plan": plan} if stand_in else None
            handoff = None
            released = False
            try:
                ch.send({"status": "release"})
                # The source sends its hand-over as its last act and exits without waiting for
                # an answer: the bytes wait in the socket, and no request arriving meanwhile is
                # read by a process that is about to vanish.
                handoff = _handoff(ch, old)
                released = True
            except Exception:
                pass
            if not released and old is not None and old.poll() is None:
                # The current process did not take the release (it gave up the move just before
                # it came: a Ctrl-C, its own time limit) and still runs: it stays the kernel.
                self.process, self.pid, self.pgid = old, old.pid, old_pgid
                self._discard(proc)
                return
            # (the source died after release: the destination answers no pending cell)
            if old is not None:
                try:
                    old.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    old.kill()
                    old.wait()
            slot.channel.send({"go": handoff})
        finally:
            slot.finished.set()
            self._slots.pop(token, None)

    def _discard(self, proc: subprocess.Popen[bytes]) -> None:
        if self.process is proc:
            return  # never the process Jupyter follows
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            proc.kill()
        proc.wait()
        with self._lock:
            self._pending.discard(proc)

    # -- lifecycle: follow the current process, and never leave a destination behind --------------

    async def kill(self, restart: bool = False) -> None:
        self._kill_pending()
        await super().kill(restart)

    async def terminate(self, restart: bool = False) -> None:
        self._kill_pending()
        await super().terminate(restart)

    def _kill_pending(self) -> None:
        lock = getattr(self, "_lock", None)
        if lock is None:
            return
        with lock:
            pending = list(self._pending)
        for p in pending:
            self._discard(p)

    async def cleanup(self, restart: bool = False) -> None:
        self._close_control()
        if not restart and self._standby_key_used is not None:
            self._standby_key_used = None
            warm.pool().release(id(self))  # the last kernel of a key takes its standbys along
        await super().cleanup(restart)

    def _close_control(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


def _closed(ch: control.Channel) -> bool:
    """Whether the other side of ``ch`` has closed it (what it sent stays unread)."""
    try:
        ready, _, _ = select.select([ch.sock], [], [], 0)
        return bool(ready) and ch.sock.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def _handoff(ch: control.Channel, old: Any) -> Any:
    """The hand-over the released process sends before it exits. EOFError when it closed the
    channel without one; waits as long as it runs (a loaded machine), at most 10 minutes."""
    deadline = time.monotonic() + 600
    while True:
        try:
            return ch.recv(timeout=1.0).get("handoff")
        except TimeoutError:
            if (old is not None and old.poll() is not None) or time.monotonic() > deadline:
                raise
