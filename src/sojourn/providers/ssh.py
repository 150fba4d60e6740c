"""``ssh``: hosts you own, reached with the system's ``ssh`` client.

Hosts are the ``[ssh.NAME]`` tables of the repository's ``machines.toml``::

    [ssh.gpu1]
    host = "gpu1.lab.example.org"   # required
    user = "ana"                    # default: ssh's own (~/.ssh/config)
    port = 22
    key = "~/.ssh/id_ed25519"       # default: ssh's own
    python = "/opt/py3.12/bin/python3"
    workdir = "/scratch/ana/sojourn"  # where allocations' directories and logs go on the host
    cpus = 32
    memory = "256GiB"
    gpus = 4
    gpu = "A100"
    arch = "x86_64"
    price_per_hour = 0.0
    options = ["ProxyJump=bastion"]   # more `ssh -o` options

A launch runs ``spec.argv`` on the host, detached (``setsid nohup``, output to
``<workdir>/<allocation>.log``), and names it by (host, boot id, pid, start time), so that
``status`` and ``terminate`` never mistake a reused pid for it. Every call is ``ssh
-o BatchMode=yes`` (never a password prompt) over one shared connection per host
(``ControlMaster``; :meth:`SshProvider.close` ends them).

The host has no hard stop of its own: a launch with ``hard_stop`` runs under coreutils'
``timeout``, which sends SIGTERM at the hard stop (the supervisor pauses the session) and
SIGKILL a grace period later. The workspace reaches the host through the repository: the
host must reach the repository URL in ``spec.argv`` (a shared file system, or S3).
"""

from __future__ import annotations

import math
import os
import shlex
import shutil
import subprocess
import tempfile
import time
from dataclasses import replace
from typing import Any

from sojourn.providers.base import (
    Handle,
    LaunchFailed,
    LaunchSpec,
    Offer,
    ProviderError,
    Requirements,
    Status,
    cheapest_first,
)
from sojourn.providers.slurm import provider_config

KEYS = ("host", "user", "port", "key", "python", "workdir", "cpus", "memory", "gpus", "gpu", "arch",
        "price_per_hour", "options", "max_duration")
CONNECT_TIMEOUT = 10
DEFAULT_WORKDIR = "$HOME/.sojourn/ssh"

# `cut -f20` of what follows ") " in /proc/PID/stat is field 22, the start time in clock
# ticks since boot: with the boot id, it names one process for good.
_START = "sed 's/.*) //' /proc/{pid}/stat 2>/dev/null | cut -d' ' -f20"


def _size(v: Any) -> int | None:
    if v is None or isinstance(v, int):
        return v
    from sojourn.workspace.sessions import parse_size

    return parse_size(str(v))


# Seconds after the hard stop plus the session's grace at which `timeout` ends what is left.
BACKSTOP_MARGIN_S = 5.0


def _remote_grace(env: dict[str, str]) -> float:
    """The hard-stop grace the remote session will use: ``SOJOURN_HARD_STOP_GRACE`` as sent
    in the launch environment, else the supervisor's default (60 s)."""
    try:
        return max(0.1, float(env.get("SOJOURN_HARD_STOP_GRACE", "60")))
    except ValueError:
        return 60.0


class SshProvider:
    """The ``[ssh.NAME]`` hosts of ``repo``'s machines config (or ``hosts`` given here)."""

    name = "ssh"
    terminate_grace = 60.0

    def __init__(self, repo: Any = None, *, hosts: dict[str, dict[str, Any]] | None = None,
                 control_dir: str | None = None):
        self.repo = repo
        raw = hosts if hosts is not None else provider_config(repo, "ssh")
        self.hosts: dict[str, dict[str, Any]] = {}
        for name, h in raw.items():
            if not isinstance(h, dict) or not h.get("host"):
                raise ProviderError(f"machines.toml: [ssh.{name}] needs host = \"...\"")
            unknown = sorted(set(h) - set(KEYS))
            if unknown:
                raise ProviderError(f"machines.toml: [ssh.{name}] has unknown key(s) {', '.join(unknown)}; "
                                    f"known: {', '.join(KEYS)}")
            self.hosts[name] = dict(h)
        # A short path: ControlPath must fit in a socket address (about 100 bytes).
        self._own_control_dir = control_dir is None
        self.control_dir = control_dir or tempfile.mkdtemp(prefix="sj-ssh-")

    # -- ssh -----------------------------------------------------------------------------------

    def host(self, name: str) -> dict[str, Any]:
        h = self.hosts.get(name)
        if h is None:
            known = ", ".join(sorted(self.hosts)) or "none"
            raise LaunchFailed(f"no ssh host {name!r} in machines.toml (known: {known}); add [ssh.{name}] with "
                               "host = \"...\"", "catalog")
        return h

    def ssh_argv(self, name: str) -> list[str]:
        h = self.host(name)
        argv = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={CONNECT_TIMEOUT}",
                "-o", "ControlMaster=auto", "-o", f"ControlPath={self.control_dir}/%C", "-o", "ControlPersist=60",
                "-o", "ServerAliveInterval=15"]
        if h.get("port"):
            argv += ["-p", str(h["port"])]
        if h.get("key"):
            argv += ["-i", os.path.expanduser(str(h["key"])), "-o", "IdentitiesOnly=yes"]
        for opt in h.get("options") or []:
            argv += ["-o", str(opt)]
        target = f"{h['user']}@{h['host']}" if h.get("user") else str(h["host"])
        return [*argv, target]

    def run(self, name: str, script: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run a POSIX shell ``script`` on host ``name``."""
        argv = [*self.ssh_argv(name), "sh -c " + shlex.quote(script)]
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        except FileNotFoundError as e:
            raise ProviderError("the ssh client is not installed (apt-get install openssh-client)") from e
        except subprocess.TimeoutExpired as e:
            raise ProviderError(f"ssh to {name} did not finish within {timeout:g} s") from e

    def close(self) -> None:
        """End the shared connections (their master processes)."""
        for name in self.hosts:
            try:
                subprocess.run([*self.ssh_argv(name)[:-1], "-O", "exit", self.ssh_argv(name)[-1]],
                               capture_output=True, timeout=10, stdin=subprocess.DEVNULL)
            except (OSError, subprocess.TimeoutExpired):
                pass
        if self._own_control_dir:
            shutil.rmtree(self.control_dir, ignore_errors=True)

    # -- offers --------------------------------------------------------------------------------

    def offer_of(self, name: str) -> Offer:
        h = self.host(name)
        return Offer(provider=self.name, name=name, cpus=h.get("cpus"), memory=_size(h.get("memory")),
                     gpus=int(h.get("gpus", 0)), gpu=h.get("gpu"), arch=str(h.get("arch", "x86_64")),
                     region=str(h["host"]), price_per_hour=float(h.get("price_per_hour", 0.0)),
                     python=str(h.get("python", "python3")), extra={"host": h["host"], "user": h.get("user")})

    def offers(self, req: Requirements) -> list[Offer]:
        if req.provider and req.provider != self.name:
            return []
        prices = self.machine_prices()
        found = [self.offer_of(n) for n in self.hosts]
        # A [machines.NAME] of this provider sets the host's price (`machines set NAME --price`).
        found = [replace(o, price_per_hour=prices[o.name]) if o.name in prices else o for o in found]
        return cheapest_first([o for o in found if o.fits(req)])

    def machine_prices(self) -> dict[str, float]:
        if self.repo is None or not hasattr(self.repo, "backend"):
            return {}
        from sojourn.providers.machines import load_machines

        return {m.name: m.price_per_hour for m in load_machines(self.repo).values() if m.provider == self.name}

    def probe(self, name: str) -> dict[str, Any]:
        """Reach the host and read what it has (the live check): arch, CPUs, Python."""
        h = self.host(name)
        py = shlex.quote(str(h.get("python", "python3")))
        p = self.run(name, f"uname -m; nproc; {py} -c 'import platform; print(platform.python_version())'")
        if p.returncode != 0:
            raise LaunchFailed(f"cannot reach ssh host {name} ({h['host']}): {p.stderr.strip()}", _check_of(p))
        arch, cpus, version = ([*p.stdout.split(), "", "", ""])[:3]
        return {"arch": arch, "cpus": int(cpus) if cpus.isdigit() else None, "python_version": version or None}

    # -- launch, status, terminate -------------------------------------------------------------

    def workdir(self, name: str) -> str:
        return str(self.host(name).get("workdir") or DEFAULT_WORKDIR)

    def launch(self, offer: Offer, spec: LaunchSpec) -> Handle:
        if offer.provider != self.name:
            raise LaunchFailed(f"offer {offer.name!r} is from provider {offer.provider!r}, not {self.name!r}", "catalog")
        if not spec.argv:
            raise LaunchFailed("nothing to launch: the command line is empty", "launch")
        self.host(offer.name)
        base = self.workdir(offer.name)
        # The workdir may start with $HOME: double-quoted so that the remote shell expands it.
        wd = f'"{base}"' if base.startswith("$") else shlex.quote(base)
        al = shlex.quote(spec.allocation)
        cwd = shlex.quote(spec.cwd) if spec.cwd else f'"$WD"/{al}'
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(spec.env.items()))
        argv = list(spec.argv)
        hard = spec.hard_stop or _seconds(self.host(offer.name).get("max_duration"))
        if hard:
            # A backstop only: sojourn's own watchdog (in the session's supervisor) fires at the
            # hard stop, gives the session its grace to pause and records a hard stop. Firing
            # at the same moment, `timeout`'s SIGTERM reached the supervisor first, which took it
            # for a pause request and recorded the session `suspended`.
            backstop = math.ceil(hard + _remote_grace(spec.env) + BACKSTOP_MARGIN_S)
            grace = int(self.terminate_grace)
            argv = ["timeout", "-s", "TERM", "-k", f"{grace}s", f"{backstop}s", *argv]
        script = "\n".join([
            "set -e", f"WD={wd}", f'mkdir -p "$WD" {cwd}', f"cd {cwd}",
            *([f"export {exports}"] if exports else []),
            f'setsid nohup {shlex.join(argv)} > "$WD"/{al}.log 2>&1 < /dev/null &',
            "pid=$!",
            f'echo "$pid $({_START.format(pid="$pid")}) $(cat /proc/sys/kernel/random/boot_id 2>/dev/null || echo -)"',
            f'echo "$WD"/{al}.log',
        ])
        p = self.run(offer.name, script)
        if p.returncode != 0:
            raise LaunchFailed(f"could not start the command on ssh host {offer.name}: {p.stderr.strip()}",
                               _check_of(p))
        lines = p.stdout.splitlines()
        words = lines[0].split() if lines else []
        if len(words) < 2 or not words[0].isdigit():
            raise LaunchFailed(f"ssh host {offer.name} answered {p.stdout.strip()!r}, not a process id", "launch")
        return Handle(self.name, offer.name, spec.allocation, {
            "host": self.host(offer.name)["host"], "pid": int(words[0]), "pid_start": words[1],
            "boot_id": words[2] if len(words) > 2 and words[2] != "-" else None,
            "log": lines[1] if len(lines) > 1 else None, "hard_stop": time.time() + hard if hard else None})

    def _alive_script(self, handle: Handle) -> str:
        pid, start, boot = int(handle.data["pid"]), str(handle.data.get("pid_start")), handle.data.get("boot_id")
        check_boot = (f'[ "$(cat /proc/sys/kernel/random/boot_id 2>/dev/null)" = {shlex.quote(str(boot))} ] || '
                      "exit 3\n") if boot else ""
        return f'{check_boot}[ "$({_START.format(pid=pid)})" = {shlex.quote(start)} ] || exit 3\n'

    def status(self, handle: Handle) -> Status:
        try:
            p = self.run(handle.machine, self._alive_script(handle) + "exit 0", timeout=30)
        except (ProviderError, LaunchFailed):
            return "unknown"
        if p.returncode == 0:
            return "running"
        if p.returncode == 3:
            return "ended"
        return "unknown"  # ssh itself failed (255): the host is unreachable, not the process gone

    def terminate(self, handle: Handle, grace: float | None = None) -> None:
        """SIGTERM to the process group (a sojourn supervisor forwards it: the session pauses),
        then, after ``grace`` seconds, SIGKILL to the group and every descendant still there."""
        pid = int(handle.data["pid"])
        ticks = max(1, int((self.terminate_grace if grace is None else grace) * 10))
        script = self._alive_script(handle).replace("exit 3", "exit 0") + "\n".join([
            f"kill -TERM -- -{pid} 2>/dev/null || kill -TERM {pid} 2>/dev/null || true",
            f"i=0; while [ $i -lt {ticks} ]; do",
            f'  [ "$({_START.format(pid=pid)})" = {shlex.quote(str(handle.data.get("pid_start")))} ] || exit 0',
            "  sleep 0.1; i=$((i+1))",
            "done",
            # Descendants: the session runs in a group of its own, so the group kill misses it.
            "desc() { for c in $(ps -o pid= --ppid \"$1\" 2>/dev/null); do echo $c; desc $c; done; }",
            f"kids=$(desc {pid})",
            f"kill -KILL -- -{pid} 2>/dev/null || true",
            f"kill -KILL {pid} $kids 2>/dev/null || true",
        ])
        timeout = ticks / 10 + 60
        p = self.run(handle.machine, script, timeout=timeout)
        if p.returncode not in (0,):
            raise ProviderError(f"could not terminate {handle.allocation} on ssh host {handle.machine}: "
                                f"{p.stderr.strip() or f'exit code {p.returncode}'}")


def _seconds(v: Any) -> float | None:
    if v is None:
        return None
    from sojourn.workspace.machine import parse_duration

    return parse_duration(v)


def _check_of(p: subprocess.CompletedProcess[str]) -> str:
    e = p.stderr.lower()
    if p.returncode == 255 and ("permission denied" in e or "host key verification failed" in e):
        return "permission"
    if p.returncode == 255:
        return "capacity"  # the host is down or unreachable: not there now
    return "launch"

