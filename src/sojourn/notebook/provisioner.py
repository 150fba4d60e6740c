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

Registered under the ``jupyter_client.kernel_provisioners`` entry point as
``sojourn-provisioner``; the ``sojourn`` kernelspec names it in its metadata, with
``config`` keys that become this class's traits (machine, repo, autosave).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from jupyter_client.launcher import launch_kernel
from jupyter_client.provisioning import LocalProvisioner
from traitlets import Bool, Unicode

from sojourn.notebook import control
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

    _server: control.Server | None = None
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
        kwargs["env"] = env
        self._cmd = list(kwargs["cmd"])
        self._launch = {k: v for k, v in kwargs.items() if k != "cmd"}
        return kwargs

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
        proc: subprocess.Popen[bytes] = launch_kernel(cmd, **kw)
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
        msg = ch.recv(timeout=30)
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
            old = self.process
            self.process, self.pid = proc, proc.pid
            try:
                self.pgid = os.getpgid(proc.pid)
            except OSError:
                self.pgid = None
            with self._lock:
                self._pending.discard(proc)
                self._suspended = {"target": target, "plan": plan} if stand_in else None
            handoff = None
            try:
                ch.send({"status": "release"})
                # The source sends its hand-over as its last act and exits without waiting for
                # an answer: the bytes wait in the socket, and no request arriving meanwhile is
                # read by a process that is about to vanish.
                handoff = ch.recv(timeout=30).get("handoff")
            except Exception:
                pass  # the source died after release: the destination answers no pending cell
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
        await super().cleanup(restart)

    def _close_control(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
