"""``slurm``: a Slurm cluster reached through its client commands (``sinfo``, ``sbatch``,
``squeue``, ``sacct``, ``scontrol``, ``scancel``) on this host.

Offers are the cluster's partitions (``scontrol show partition`` / ``show node``): CPUs,
memory and GPUs of their largest node, the CPU architecture, the partition's time limit.
A launch writes a batch script and submits it with ``sbatch --parsable``:

* ``--time`` is the hard stop (Slurm ends the job there, whatever runs in it);
* ``--signal=B:USR1@N`` sends SIGUSR1 to the batch shell N seconds before (Slurm may send it
  up to 60 s earlier): the script ``exec``s the sojourn supervisor, which takes it as a
  notice (``SOJOURN_SLURM_NOTICE_S``) and pauses the session with stop reason ``preempted``;
* ``--requeue`` where the cluster allows it (``JobRequeue``): a requeued job starts its script
  again, and the script then resumes the workspace (``SLURM_RESTART_COUNT`` > 0) rather than
  run the launch command a second time;
* ``--mem``, ``--cpus-per-task`` from the offer's request; output to ``<dir>/<allocation>.out``.

Configuration (optional) is the ``[slurm]`` table of the repository's ``machines.toml``::

    [slurm]
    partitions = ["gpu", "debug"]   # default: every partition that is up
    account = "proj42"
    qos = "normal"
    signal_s = 120                  # seconds of notice before the time limit
    requeue = true                  # false: never --requeue
    price_per_hour = 0.0            # what an hour of a job costs you, for the spend
    python = "/opt/py3.12/bin/python3"
    default_time = "4h"             # --time when the launch gives no hard stop
    sbatch_args = ["--constraint=ib"]
"""

from __future__ import annotations

import math
import os
import re
import shlex
import shutil
import subprocess
import time
import tomllib
from pathlib import Path
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

PENDING = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SPECIAL_EXIT",
           "RESIZING"}
RUNNING = {"RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT"}
ENDED = {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "BOOT_FAIL", "DEADLINE",
         "OUT_OF_MEMORY", "REVOKED"}
# Pending reasons that mean "never", not "later".
NEVER_RUNS = {"PartitionConfig", "PartitionNodeLimit", "BadConstraints", "PartitionTimeLimit", "InvalidQOS",
              "InvalidAccount", "QOSMaxCpuPerJobLimit", "QOSMaxMemoryPerJob"}
DEFAULT_SIGNAL_S = 120
COMMAND_TIMEOUT = 30.0


def slurm_time(seconds: float) -> str:
    """``--time`` text: Slurm counts whole minutes, so round up (never below one)."""
    minutes = max(1, math.ceil(seconds / 60.0))
    days, rest = divmod(minutes, 24 * 60)
    hours, mins = divmod(rest, 60)
    return f"{days}-{hours:02d}:{mins:02d}:00" if days else f"{hours:02d}:{mins:02d}:00"


def parse_slurm_time(text: str) -> float | None:
    """Seconds of a Slurm time limit (``UNLIMITED``/``INFINITE`` and unknowns: None)."""
    t = text.strip()
    if not t or t.upper() in ("UNLIMITED", "INFINITE", "NONE", "N/A"):
        return None
    days = 0
    if "-" in t:
        d, t = t.split("-", 1)
        days = int(d)
    parts = [int(p) for p in t.split(":")]
    if len(parts) == 1:  # minutes
        secs = parts[0] * 60
    elif len(parts) == 2:  # minutes:seconds
        secs = parts[0] * 60 + parts[1]
    else:
        secs = parts[0] * 3600 + parts[1] * 60 + parts[2]
    return float(days * 86400 + secs)


def parse_records(text: str) -> list[dict[str, str]]:
    """``scontrol show ... -o`` output: one record a line, ``Key=Value`` words."""
    out = []
    for line in text.splitlines():
        rec: dict[str, str] = {}
        for word in re.findall(r"(\S+?)=(\S*)", line):
            rec.setdefault(word[0], word[1])
        if rec:
            out.append(rec)
    return out


def _gpus(gres: str) -> tuple[int, str | None]:
    """``gpu:a100:4(S:0-1)``, ``gpu:2`` -> (count, model)."""
    total, model = 0, None
    for item in (gres or "").split(","):
        parts = re.sub(r"\(.*?\)", "", item).split(":")
        if not parts or parts[0] != "gpu":
            continue
        if len(parts) >= 3:
            model = parts[1]
        try:
            total += int(parts[-1])
        except ValueError:
            total += 1
    return total, model


def _arch(a: str) -> str:
    a = (a or "x86_64").lower()
    return {"amd64": "x86_64", "aarch64": "arm64"}.get(a, a)


class SlurmProvider:
    """The partitions of the Slurm cluster this host submits to."""

    name = "slurm"
    terminate_grace = 60.0  # seconds between SIGTERM to the supervisor (it pauses) and scancel

    def __init__(self, repo: Any = None, *, config: dict[str, Any] | None = None, workdir: str | None = None):
        self.repo = repo
        self.config = dict(config) if config is not None else provider_config(repo, "slurm")
        base = workdir or self.config.get("workdir")
        if base is None:
            from sojourn.repository.repo import sojourn_home

            base = str(sojourn_home() / "slurm")
        self.workdir = Path(base)

    # -- the client commands -------------------------------------------------------------------

    def _cmd(self, *argv: str, check: bool = True, timeout: float = COMMAND_TIMEOUT) -> subprocess.CompletedProcess[str]:
        if shutil.which(argv[0]) is None:
            raise ProviderError(f"the Slurm client command {argv[0]!r} is not on PATH: install slurm-client "
                                "(or run sojourn on the cluster's login node)")
        try:
            p = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as e:
            raise ProviderError(f"{' '.join(argv)} did not answer within {timeout:g} s (is slurmctld up?)") from e
        if check and p.returncode != 0:
            raise ProviderError(f"{' '.join(argv)} failed (exit code {p.returncode}): {p.stderr.strip()}")
        return p

    def cluster_allows_requeue(self) -> bool:
        try:
            cfg = self._cmd("scontrol", "show", "config").stdout
        except ProviderError:
            return False
        m = re.search(r"^JobRequeue\s*=\s*(\d+)", cfg, re.MULTILINE)
        return m is None or m.group(1) != "0"

    # -- offers --------------------------------------------------------------------------------

    def partitions(self) -> list[dict[str, Any]]:
        parts = parse_records(self._cmd("scontrol", "show", "partition", "-o").stdout)
        nodes = parse_records(self._cmd("scontrol", "show", "node", "-o").stdout)
        wanted = self.config.get("partitions")
        out = []
        for p in parts:
            name = p.get("PartitionName", "")
            if p.get("State", "UP") != "UP" or (wanted and name not in wanted):
                continue
            members = [n for n in nodes if name in (n.get("Partitions") or "").split(",")]
            if not members:
                continue
            gpus = [_gpus(n.get("Gres", "")) for n in members]
            best = max(members, key=lambda n: int(n.get("CPUTot") or 0))
            out.append({
                "partition": name,
                "cpus": max(int(n.get("CPUTot") or 0) for n in members),
                "memory_mb": max(int(n.get("RealMemory") or 0) for n in members),
                "gpus": max(g[0] for g in gpus),
                "gpu": next((g[1] for g in gpus if g[1]), None),
                "arch": _arch(best.get("Arch", "")),
                "max_time": parse_slurm_time(p.get("MaxTime", "")),
                "nodes": len(members),
                "default": p.get("Default") == "YES",
            })
        return out

    def offers(self, req: Requirements) -> list[Offer]:
        if req.provider and req.provider != self.name:
            return []
        out = []
        prices = self.machine_prices()
        for p in self.partitions():
            offer = Offer(provider=self.name, name=p["partition"], cpus=p["cpus"], memory=p["memory_mb"] << 20,
                          gpus=p["gpus"], gpu=p["gpu"], arch=p["arch"], region=self.config.get("cluster"),
                          price_per_hour=prices.get(p["partition"], float(self.config.get("price_per_hour", 0.0))),
                          python=self.config.get("python"),
                          notice_s=float(self.config.get("signal_s", DEFAULT_SIGNAL_S)),
                          extra={"partition": p["partition"], "max_time": p["max_time"], "nodes": p["nodes"],
                                 # What a launch asks for: the requirement, not the whole node.
                                 "cpus_per_task": req.cpus or 1, "mem": req.memory, "gpus_per_task": req.gpus})
            if offer.fits(req):
                out.append(offer)
        return cheapest_first(out)

    def machine_prices(self) -> dict[str, float]:
        """The ``--price`` of each configured machine of this provider (``[machines.P]`` with
        ``provider = "slurm"``, named like its partition): what the router and the launch check
        compare. ``[slurm] price_per_hour`` is only the default for a partition no machine names."""
        if self.repo is None or not hasattr(self.repo, "backend"):
            return {}
        from sojourn.providers.machines import load_machines

        return {m.name: m.price_per_hour for m in load_machines(self.repo).values() if m.provider == self.name}

    # -- launch --------------------------------------------------------------------------------

    def hard_stop_of(self, offer: Offer, spec: LaunchSpec) -> float | None:
        if spec.hard_stop:
            return float(spec.hard_stop)
        from sojourn.workspace.machine import parse_duration

        default = parse_duration(self.config.get("default_time"))
        return default if default is not None else offer.extra.get("max_time")

    def script(self, offer: Offer, spec: LaunchSpec) -> str:
        """The batch script for ``spec`` on ``offer`` (also what tests compare)."""
        out_dir = self.workdir
        hard = self.hard_stop_of(offer, spec)
        signal_s = int(self.config.get("signal_s", DEFAULT_SIGNAL_S))
        if hard is not None:
            # The notice must come before the end, and Slurm may send it up to 60 s earlier
            # than asked: keep it at least 15 s after the start when the limit allows, or it
            # can reach the batch shell before Python has installed its handler (and kill it).
            signal_s = max(1, min(signal_s, int(hard // 2), *([int(hard) - 75] if hard > 76 else [])))
        lines = ["#!/bin/bash", f"#SBATCH --job-name=sojourn-{spec.workspace}",
                 f"#SBATCH --partition={offer.extra.get('partition', offer.name)}",
                 f"#SBATCH --output={out_dir / (spec.allocation + '.out')}", "#SBATCH --open-mode=append",
                 "#SBATCH --nodes=1", "#SBATCH --ntasks=1",
                 f"#SBATCH --cpus-per-task={int(offer.extra.get('cpus_per_task') or 1)}",
                 f"#SBATCH --signal=B:USR1@{signal_s}"]
        if hard is not None:
            lines.append(f"#SBATCH --time={slurm_time(hard)}")
        mem = offer.extra.get("mem")
        if mem:
            lines.append(f"#SBATCH --mem={max(1, math.ceil(int(mem) / 2**20))}M")
        if offer.extra.get("gpus_per_task"):
            lines.append(f"#SBATCH --gres=gpu:{int(offer.extra['gpus_per_task'])}")
        if spec.cwd:
            lines.append(f"#SBATCH --chdir={spec.cwd}")
        for key in ("account", "qos"):
            if self.config.get(key):
                lines.append(f"#SBATCH --{key}={self.config[key]}")
        requeue = bool(self.config.get("requeue", True)) and self.cluster_allows_requeue()
        lines.append("#SBATCH --requeue" if requeue else "#SBATCH --no-requeue")
        lines += [f"#SBATCH {a}" for a in self.config.get("sbatch_args", [])]
        lines.append("")
        env = {**spec.env, "SOJOURN_SLURM_SIGNAL": "USR1", "SOJOURN_SLURM_NOTICE_S": str(signal_s),
               "SOJOURN_ALLOCATION": spec.allocation}
        lines += [f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items())]
        lines.append("")
        # exec: the supervisor *is* the batch shell, so --signal=B:USR1 reaches it.
        resume = self.resume_argv(spec)
        if requeue and resume:
            lines += ['if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then',
                      "  # requeued (preempted or node failure): carry the workspace on from its last capsule",
                      f"  exec {shlex.join(resume)}", "fi"]
        lines.append(f"exec {shlex.join(spec.argv)}")
        return "\n".join(lines) + "\n"

    def resume_argv(self, spec: LaunchSpec) -> list[str] | None:
        """What a requeued job runs: ``sojourn resume WS`` with the same interpreter."""
        if not spec.argv or not spec.workspace.startswith("ws_") or self.repo is None:
            return None
        url = getattr(self.repo, "url", None)
        if not url:
            return None
        first = os.path.basename(spec.argv[0])
        cmd = [spec.argv[0], "-m", "sojourn.cli.main"] if first.startswith("python") else ["sojourn"]
        return [*cmd, "resume", spec.workspace, "--repo", str(url)]

    def launch(self, offer: Offer, spec: LaunchSpec) -> Handle:
        if offer.provider != self.name:
            raise LaunchFailed(f"offer {offer.name!r} is from provider {offer.provider!r}, not {self.name!r}", "catalog")
        if not spec.argv:
            raise LaunchFailed("nothing to launch: the command line is empty", "launch")
        try:
            self.workdir.mkdir(parents=True, exist_ok=True)
            path = self.workdir / f"{spec.allocation}.sbatch"
            path.write_text(self.script(offer, spec))
        except OSError as e:
            raise LaunchFailed(f"cannot write the batch script in {self.workdir}: {e.strerror or e}", "launch") from e
        try:
            p = self._cmd("sbatch", "--parsable", str(path), check=False)
        except ProviderError as e:
            raise LaunchFailed(str(e), "launch") from e
        if p.returncode != 0:
            err = p.stderr.strip()
            raise LaunchFailed(f"sbatch refused the job on partition {offer.name}: {err}", _check_of(err))
        job = p.stdout.strip().split(";")[0]
        if not job.isdigit():
            raise LaunchFailed(f"sbatch answered {p.stdout.strip()!r}, not a job id", "launch")
        self._never_runs(job, offer)
        hard = self.hard_stop_of(offer, spec)
        return Handle(self.name, offer.name, spec.allocation,
                      {"job_id": job, "script": str(path), "output": str(self.workdir / f"{spec.allocation}.out"),
                       "submitted": time.time(), "hard_stop": time.time() + hard if hard else None})

    def _never_runs(self, job: str, offer: Offer) -> None:
        """A cluster without ``EnforcePartLimits`` takes a job it can never run and leaves it
        pending; such a job is cancelled and reported as a capacity refusal."""
        p = self._cmd("squeue", "-h", "-j", job, "-o", "%T|%r", check=False)
        state, _, reason = p.stdout.strip().partition("|")
        if state == "PENDING" and reason in NEVER_RUNS:
            self._cmd("scancel", job, check=False)
            raise LaunchFailed(f"partition {offer.name} can never run this job (Slurm says {reason}: more CPUs, "
                               "memory or GPUs than a node has, or than the partition allows); it was cancelled",
                               "capacity")

    # -- status, terminate -----------------------------------------------------------------------

    def job_state(self, handle: Handle) -> str | None:
        """The job's Slurm state (``RUNNING``, ``COMPLETED``...), None when Slurm forgot it."""
        job = str(handle.data["job_id"])
        p = self._cmd("squeue", "-h", "-j", job, "-o", "%T", check=False)
        if p.returncode == 0 and p.stdout.strip():
            return p.stdout.split()[0].strip().upper()
        if p.returncode != 0 and "Invalid job id" not in p.stderr:
            raise ProviderError(f"squeue -j {job} failed: {p.stderr.strip()}")
        # Gone from the queue: accounting knows how it ended, where accounting runs.
        p = self._cmd("sacct", "-n", "-X", "-P", "-j", job, "-o", "State", check=False)
        if p.returncode == 0 and p.stdout.strip():
            return p.stdout.split()[0].strip().upper()
        p = self._cmd("scontrol", "show", "job", "-o", job, check=False)
        if p.returncode == 0:
            recs = parse_records(p.stdout)
            if recs and recs[0].get("JobState"):
                return recs[0]["JobState"].upper()
        return None

    def status(self, handle: Handle) -> Status:
        try:
            state = self.job_state(handle)
        except ProviderError:
            return "unknown"
        if state is None:
            return "ended"  # purged from the controller's memory: it ended a while ago
        state = state.split("+")[0]  # "CANCELLED+" / "CANCELLED by 0"
        if state in PENDING:
            return "pending"
        if state in RUNNING:
            return "running"
        if state in ENDED:
            return "ended"
        return "unknown"

    def terminate(self, handle: Handle, grace: float | None = None) -> None:
        """SIGTERM to the batch shell (the supervisor: the session pauses), then, after
        ``grace`` seconds, ``scancel`` (Slurm's own SIGTERM, then SIGKILL, to everything)."""
        job = str(handle.data["job_id"])
        st = self.status(handle)
        if st == "ended":
            return
        if st == "running":
            self._cmd("scancel", "--batch", "--signal=TERM", job, check=False)
            deadline = time.monotonic() + (self.terminate_grace if grace is None else grace)
            while time.monotonic() < deadline:
                if self.status(handle) == "ended":
                    return
                time.sleep(0.2)
        self._cmd("scancel", job, check=False)

    def signal(self, handle: Handle, sig: str = "USR1") -> None:
        """Send ``sig`` to the job's batch shell, as ``--signal=B:`` does before the time limit
        (and as a preemption does where ``preempt_send_user_signal`` is set)."""
        self._cmd("scancel", "--batch", f"--signal={sig}", str(handle.data["job_id"]))


def _check_of(err: str) -> str:
    """Which of the four checks an sbatch refusal failed."""
    e = err.lower()
    if any(w in e for w in ("invalid account", "access denied", "not permitted", "invalid qos", "user's group")):
        return "permission"
    if any(w in e for w in ("invalid partition", "invalid generic resource", "invalid feature")):
        return "catalog"
    if any(w in e for w in ("node configuration is not available", "exceeded", "limit", "qosmax", "too many")):
        return "capacity"
    return "launch"


def provider_config(repo: Any, table: str) -> dict[str, Any]:
    """The ``[<table>]`` table of the repository's ``machines.toml`` (empty without one)."""
    from sojourn.errors import ObjectNotFound

    if repo is None or not hasattr(repo, "backend"):
        return {}
    try:
        raw = repo.backend.load("config", "machines.toml")
    except ObjectNotFound:
        return {}
    try:
        doc = tomllib.loads(raw.decode())
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ProviderError(f"machines.toml is not valid TOML ({e}); fix it") from e
    found = doc.get(table, {})
    if not isinstance(found, dict):
        raise ProviderError(f"machines.toml: [{table}] must be a table")
    if found and hasattr(repo, "key"):
        from sojourn.workspace.signing import RecordKey, config_signed

        # Its interpreters, hosts and sbatch options decide what runs where: only a config
        # the repository key signed is used (docs/records-format.md, "machines.toml").
        if not config_signed(RecordKey(repo.key, repo.id), "machines.toml", raw.decode()):
            raise ProviderError(
                f"machines.toml: [{table}] is in a config not signed with the repository key (edited by hand, written "
                "by an older sojourn, or by someone without the key), so it was not used. Check the file, then "
                "`sojourn machines sign` signs it")
    return found
