"""The Slurm provider against a REAL single-node Slurm (slurmctld + slurmd + munge on
127.0.0.1, started by tools/slurm-localhost; it needs root and apt-installs Slurm if missing).

Besides the conformance suite: the batch script (hard stop, notice signal, requeue), the
four checks on refusals, and the round trip of issue 6: `sojourn run` as a Slurm job,
preempted by its notice signal, resumed on `local`, suspended, resumed on Slurm again; the
whole output equals an unmoved run's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sojourn.providers.base import (
    Handle,
    LaunchFailed,
    LaunchSpec,
    Offer,
    Requirements,
    get_provider,
)
from sojourn.providers.slurm import SlurmProvider, parse_slurm_time, slurm_time
from tests.conftest import ROOT
from tests.providers.conformance import ProviderConformance, wait_status
from tests.workspace.conftest import Shell, finish, wait_for

TOOL = ROOT / "tools" / "slurm-localhost"


def _sinfo_ok() -> bool:
    if shutil.which("sinfo") is None:
        return False
    p = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=30)
    return p.returncode == 0 and any(s in p.stdout for s in ("idle", "mix", "alloc"))


def _unavailable(why: str) -> None:
    if os.environ.get("SOJOURN_REQUIRE_SLURM"):
        pytest.fail(f"SOJOURN_REQUIRE_SLURM is set but Slurm cannot run here: {why}", pytrace=False)
    pytest.skip(f"no Slurm cluster: {why}")


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A running single-node cluster: the one already up, or one started (and stopped) here."""
    if _sinfo_ok():
        yield
        return
    if os.geteuid() != 0:
        _unavailable("starting slurmctld/slurmd/munged needs root (run tools/slurm-localhost start as root)")
    if shutil.which("slurmctld") is None and shutil.which("apt-get") is None:
        _unavailable("Slurm is not installed and apt-get is not there to install it")
    state = tmp_path_factory.mktemp("slurm")
    try:
        p = subprocess.run([str(TOOL), "start", str(state)], capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        _unavailable("tools/slurm-localhost start took over 15 minutes")
    if p.returncode != 0 or not _sinfo_ok():
        _unavailable(f"tools/slurm-localhost start failed ({p.returncode}): {(p.stdout + p.stderr)[-1500:]}")
    try:
        yield
    finally:
        subprocess.run([str(TOOL), "stop", str(state)], capture_output=True, timeout=60)


@pytest.fixture
def slurm(slurm_cluster: None, tmp_path: Path) -> SlurmProvider:
    p = SlurmProvider(None, workdir=str(tmp_path / "slurm-jobs"))
    p.terminate_grace = 5.0
    return p


def _small(p: SlurmProvider) -> Offer:
    offers = p.offers(Requirements(cpus=1, memory=512 << 20))
    assert offers, "the cluster offers a partition with one CPU and 512 MiB"
    return offers[0]


class TestSlurmConformance(ProviderConformance):
    start_timeout = 60.0
    end_timeout = 60.0

    @pytest.fixture
    def provider(self, slurm: SlurmProvider) -> SlurmProvider:
        return slurm

    @pytest.fixture
    def launchable(self, provider: SlurmProvider) -> Offer:
        return _small(provider)


# -- without a cluster ---------------------------------------------------------------------------


def test_slurm_times() -> None:
    assert slurm_time(59) == "00:01:00" and slurm_time(3600) == "01:00:00" and slurm_time(90061) == "1-01:02:00"
    assert parse_slurm_time("UNLIMITED") is None and parse_slurm_time("30") == 1800
    assert parse_slurm_time("1-02:03:04") == 93784 and parse_slurm_time("05:00") == 300


def test_batch_script_has_the_hard_stop_the_notice_and_execs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = SlurmProvider(None, config={"signal_s": 90, "account": "proj", "sbatch_args": ["--constraint=ib"]},
                      workdir=str(tmp_path))
    monkeypatch.setattr(p, "cluster_allows_requeue", lambda: True)
    offer = Offer("slurm", "gpu", cpus=64, memory=512 << 30, extra={"partition": "gpu", "cpus_per_task": 4,
                                                                    "mem": 8 << 30, "gpus_per_task": 1})
    spec = LaunchSpec("ws_abc", "al_1", ["/opt/py/bin/python3", "-m", "sojourn.cli.main", "run", "t.py"],
                      env={"A": "b c"}, hard_stop=7200, cwd="/work/x")
    s = p.script(offer, spec)
    for line in ("#SBATCH --time=02:00:00", "#SBATCH --signal=B:USR1@90", "#SBATCH --requeue",
                 "#SBATCH --mem=8192M", "#SBATCH --cpus-per-task=4", "#SBATCH --gres=gpu:1", "#SBATCH --chdir=/work/x",
                 "#SBATCH --account=proj", "#SBATCH --constraint=ib", "export A='b c'",
                 "export SOJOURN_SLURM_NOTICE_S=90", "exec /opt/py/bin/python3 -m sojourn.cli.main run t.py"):
        assert line in s.splitlines(), (line, s)
    assert s.splitlines()[-1].startswith("exec ")  # the supervisor is the batch shell: B:USR1 reaches it
    # Without a repository there is no resume command for a requeue; with one, a requeued job resumes.
    assert "SLURM_RESTART_COUNT" not in s
    p.repo = type("R", (), {"url": "/repos/r"})()
    s = p.script(offer, spec)
    assert "exec /opt/py/bin/python3 -m sojourn.cli.main resume ws_abc --repo /repos/r" in s
    # A short hard stop gets its notice before the end.
    spec.hard_stop = 60
    assert "#SBATCH --signal=B:USR1@30" in p.script(offer, spec).splitlines()
    monkeypatch.setattr(p, "cluster_allows_requeue", lambda: False)
    assert "#SBATCH --no-requeue" in p.script(offer, spec).splitlines()


def test_provider_is_registered() -> None:
    p = get_provider("slurm", None)
    assert isinstance(p, SlurmProvider)


# -- against the cluster ---------------------------------------------------------------------------


def test_offers_are_the_partitions(slurm: SlurmProvider) -> None:
    offers = slurm.offers(Requirements())
    assert offers and all(o.provider == "slurm" for o in offers)
    debug = next(o for o in offers if o.name == "debug")
    assert debug.cpus and debug.cpus >= 1 and debug.memory and debug.memory > 1 << 30
    assert debug.arch == {"aarch64": "arm64"}.get(os.uname().machine, os.uname().machine)
    assert slurm.offers(Requirements(gpus=1)) == []
    assert slurm.offers(Requirements(provider="local")) == []


def test_refusals_name_the_check(slurm: SlurmProvider) -> None:
    offer = _small(slurm)
    bad = Offer("slurm", "nopart", cpus=1, memory=1 << 30, extra={"partition": "nopart"})
    with pytest.raises(LaunchFailed) as e:
        slurm.launch(bad, LaunchSpec("ws_x", "al_bad", ["true"]))
    assert e.value.check == "catalog" and "nopart" in str(e.value)
    for extra in ({"mem": 1 << 50}, {"cpus_per_task": 4096}):  # refused by sbatch; taken but never runnable
        huge = Offer("slurm", offer.name, cpus=1, memory=1 << 30, extra={**offer.extra, **extra})
        with pytest.raises(LaunchFailed) as e:
            slurm.launch(huge, LaunchSpec("ws_x", "al_huge", ["true"]))
        assert e.value.check == "capacity", str(e.value)
    left = subprocess.run(["squeue", "-h", "-n", "sojourn-ws_x", "-o", "%i"], capture_output=True, text=True)
    assert left.stdout.strip() == ""  # the never-runnable job was cancelled


def test_hard_stop_is_slurms_time_limit(slurm: SlurmProvider) -> None:
    h = slurm.launch(_small(slurm), LaunchSpec("ws_t", "al_time", ["sleep", "600"], hard_stop=30))
    try:
        info = subprocess.run(["scontrol", "show", "job", "-o", h.data["job_id"]], capture_output=True, text=True)
        assert "TimeLimit=00:01:00" in info.stdout  # rounded up to Slurm's minute
        assert "Requeue=1" in info.stdout or "Requeue=0" in info.stdout
    finally:
        slurm.terminate(h)
    assert wait_status(slurm, h, {"ended"}, 60) == "ended"


# -- the round trip -------------------------------------------------------------------------------

COUNT = """
import time
import numpy as np
acc = np.arange(4, dtype=np.int64)
for i in range(40):
    acc = acc + i
    print(i, int(acc.sum()), flush=True)
    time.sleep(0.15)
print("done", acc.tolist())
"""


def _env(sh: Shell) -> dict[str, str]:
    keep = ("PYTHONPATH", "SOJOURN_CACHE", "SOJOURN_REPO", "SOJOURN_HOME", "PATH")
    # sbatch exports the submitter's whole environment, where tests/conftest.py switched the
    # notice watchers off: a job must watch for Slurm's own signal.
    return {**{k: sh.env[k] for k in keep if k in sh.env}, "SOJOURN_NOTICES": "auto"}


def _stdout_lines(sh: Shell, ws: str) -> list[str]:
    p = sh.cli("logs", ws, "--stream", "stdout")
    return p.stdout.splitlines() if p.returncode == 0 else []


def _workspace(sh: Shell) -> str | None:
    p = sh.cli("ps", "--json")
    rows: list[dict[str, Any]] = json.loads(p.stdout) if p.returncode == 0 and p.stdout.strip() else []
    return rows[0]["id"] if rows else None


def _slurm_output(h: Handle) -> str:
    try:
        return Path(h.data["output"]).read_text()
    except OSError:
        return "(no output file)"


def test_round_trip_slurm_local_slurm(slurm: SlurmProvider, tmp_path: Path) -> None:
    """Run on Slurm, preempted by the job's notice signal (USR1 to the batch shell, what
    --signal=B:USR1@N sends), resume on local, suspend, resume on Slurm to the end."""
    sh = Shell(tmp_path)
    try:
        sh.write("count.py", COUNT, prelude=False)
        expected = sh.plain("count.py")
        offer = _small(slurm)
        py = [sys.executable, "-m", "sojourn.cli.main"]
        run = slurm.launch(offer, LaunchSpec("ws_new", "al_slurm1", [*py, "run", "--repo", sh.repo, "count.py"],
                                             env=_env(sh), hard_stop=600, cwd=str(sh.dir)))
        ws = wait_for(lambda: _workspace(sh), 60, f"the job to create its workspace: {_slurm_output(run)}")
        wait_for(lambda: len(_stdout_lines(sh, ws)) >= 4 or slurm.status(run) == "ended", 60,
                 "the job's first lines in the workspace log")
        assert slurm.status(run) == "running", _slurm_output(run)
        t0 = time.monotonic()
        slurm.signal(run, "USR1")
        assert wait_status(slurm, run, {"ended"}, 60) == "ended", _slurm_output(run)
        rec = sh.show(ws)
        assert rec["state"] == "suspended", (rec["detail"], _slurm_output(run))
        assert rec["allocations"][-1]["stop_reason"] == "preempted"
        assert rec["last_capsule"]["verified"]
        print(f"slurm notice -> job ended with a verified capsule: {time.monotonic() - t0:.2f} s")
        assert "preemption notice" in _slurm_output(run)

        # On local: resume, a few lines, suspend.
        local = sh.start("resume", ws)
        assert len(sh.read_lines(local, 3)) == 3
        sus = sh.cli("suspend", ws)
        assert sus.returncode == 0, sus.stderr
        code, _, err = finish(local)
        assert code == 75, err

        # Back on Slurm, to the end.
        back = slurm.launch(offer, LaunchSpec(ws, "al_slurm2", [*py, "resume", ws, "--repo", sh.repo],
                                              env=_env(sh), hard_stop=600, cwd=str(sh.dir)))
        assert wait_status(slurm, back, {"ended"}, 120) == "ended"
        rec = sh.show(ws)
        assert rec["state"] == "finished", (rec["detail"], _slurm_output(back))
        assert [a["stop_reason"] for a in rec["allocations"]] == ["preempted", "suspended", "finished"]
        assert "\n".join(_stdout_lines(sh, ws)) + "\n" == expected
    finally:
        sh.kill_all()


LONG = """
import time
for i in range(1000):
    print(i, flush=True)
    time.sleep(0.2)
"""


def test_time_limit_notice_pauses_before_the_hard_stop(slurm: SlurmProvider, tmp_path: Path) -> None:
    """No one signals this job: Slurm itself sends --signal=B:USR1@90 before the three-minute
    limit (up to 60 s early, by its own timer), and the workspace ends preempted on a verified
    capsule rather than killed at the limit."""
    sh = Shell(tmp_path)
    try:
        sh.write("long.py", LONG, prelude=False)
        h = slurm.launch(_small(slurm), LaunchSpec("ws_new", "al_limit", [sys.executable, "-m", "sojourn.cli.main",
                                                                          "run", "--repo", sh.repo, "long.py"],
                                                   env=_env(sh), hard_stop=180, cwd=str(sh.dir)))
        # 180 s: Slurm sends the signal up to 60 s before the asked 90 s, so never before
        # Python runs (with a 60 s limit it could arrive at once and kill the batch shell).
        assert "#SBATCH --signal=B:USR1@90" in Path(h.data["script"]).read_text()
        assert wait_status(slurm, h, {"ended"}, 240) == "ended", _slurm_output(h)
        ws = _workspace(sh)
        assert ws is not None, _slurm_output(h)
        rec = sh.show(ws)
        assert rec["allocations"][-1]["stop_reason"] == "preempted", (rec["detail"], _slurm_output(h))
        assert rec["state"] == "suspended" and rec["last_capsule"]["verified"]
        state = slurm.job_state(h)
        assert state is not None and not state.startswith("TIMEOUT")  # it ended on its own, before the limit
    finally:
        sh.kill_all()


def test_the_price_of_a_partition_is_its_machines_price(slurm: SlurmProvider, tmp_path: Path) -> None:
    """`machines set PARTITION --provider slurm --price P` is what the router and the launch
    check read; ``[slurm] price_per_hour`` is only the default of a partition no machine names."""
    from sojourn.ops.machines import set_machine
    from sojourn.repository.repo import open_repository

    partition = _small(slurm).name
    repo = str(tmp_path / "repo")
    set_machine(partition, repo=repo, provider="slurm", price_per_hour=0.42)
    with open_repository(repo) as r:
        p = SlurmProvider(r, workdir=str(tmp_path / "jobs"))
        found = {o.name: o for o in p.offers(Requirements(cpus=1))}
    assert found[partition].price_per_hour == 0.42
