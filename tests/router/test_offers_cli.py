"""``sojourn offers`` and ``sojourn plan`` as a user runs them (a real `sojourn` process),
on a workspace record in a real repository."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from sojourn.workspace import records as R
from tests.conftest import SRC

GIB = 1024**3


def sojourn(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(SRC), COLUMNS="200")
    proc = subprocess.run([sys.executable, "-m", "sojourn.cli.main", *args], capture_output=True, text=True,
                          env=env, timeout=120)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def make_workspace(repo: str, *, seconds_capture: float | None) -> str:
    """A workspace that ran on the local machine ``small`` and was suspended with a 3 GiB
    capsule, written the way the supervisor writes its events."""
    from sojourn.providers.machines import parse_config, save_machines
    from sojourn.repository.repo import open_repository
    from sojourn.workspace.store import WorkspaceStore

    r = open_repository(repo, create=True)
    try:
        save_machines(r, parse_config('[machines.small]\nmemory = "2GiB"\nprice_per_hour = 0.05\n'
                                      '[machines.big]\nmemory = "8GiB"\nprice_per_hour = 0.3\n'))
        store = WorkspaceStore(r)
        meta = store.create(R.Command("train.py", [], "/tmp", sys.executable))
        ws = meta["id"]
        al = R.Allocation("al_1", "local", "small", "host", "boot", 1, 1, sys.executable, 2 * GIB, R.now(), 1)
        cap = R.CapsuleEntry("cap_" + "a" * 40, None, "suspend", "train.py:9", 3 * GIB, R.now(), "al_1", True)
        cap_ev: dict[str, Any] = {"type": "capsule", "capsule": cap.__dict__}
        if seconds_capture is not None:
            cap_ev["seconds_capture"] = seconds_capture
        store.append(ws, 1, "test",
                     {"type": "authority", "epoch": 1, "holder": "al_1"},
                     {"type": "allocation", "allocation": al.__dict__},
                     cap_ev,
                     {"type": "stopped", "allocation": "al_1", "reason": "suspended", "state": "suspended",
                      "max_rss": int(1.5 * GIB), "t": R.now()})
        store.record(ws)
        return ws
    finally:
        r.close()


def test_plan_explains_its_terms(repo: str) -> None:
    ws = make_workspace(repo, seconds_capture=None)
    out = sojourn("plan", ws, "--to", "aws:m7i.large@us-east-1", "--remaining", "2h", "--repo", repo).stdout
    assert f"workspace {ws}: remaining 2h00m (given), capsule 3.00 GiB at local:small" in out
    for term in ("compute", "launch", "transfer", "risk", "total"):
        assert f"  {term}" in out
    assert "$0.1008/h x 2 h" in out
    data = json.loads(sojourn("plan", ws, "--to", "aws:m7i.large@us-east-1:spot", "--remaining", "90m",
                              "--repo", repo, "--json").stdout)
    assert data["remaining_s"] == 5400 and data["capsule_bytes"] == 3 * GIB and data["plan"]["spot"] is True
    assert data["plan"]["usd"] == pytest.approx(sum(t["usd"] for t in data["plan"]["terms"]))
    assert data["plan"]["terms"][3]["name"] == "risk" and data["plan"]["terms"][3]["usd"] > 0
    # without --remaining the plan says what it assumed
    assumed = sojourn("plan", ws, "--to", "local:big", "--repo", repo).stdout
    assert "assumed 1 h" in assumed and "same machine" not in assumed
    bad = sojourn("plan", ws, "--to", "aws:nope", "--repo", repo, check=False)
    assert bad.returncode == 2 and "no offer 'aws:nope'" in bad.stderr


def test_offers_say_whether_the_notice_covers_saving_the_workspace(repo: str) -> None:
    ws = make_workspace(repo, seconds_capture=30.72)  # 3 GiB in 30.72 s = 100 MiB/s
    data = json.loads(sojourn("offers", "--gpu", "A100", "--spot", "--workspace", ws, "--repo", repo,
                              "--json").stdout)
    assert data["state_bytes"] == 3 * GIB
    assert data["save_s"] == pytest.approx(5 + 30.72)
    assert "100.0 MiB/s measured" in data["save_basis"]
    by_provider = {o["provider"]: o["can_save"] for o in data["offers"]}
    assert by_provider["aws"] is True  # 120 s notice
    assert by_provider["gcp"] is False and by_provider["azure"] is False  # 30 s notice
    assert by_provider["runpod"] is None  # notice not documented
    spots = [o["spot_price_per_hour"] for o in data["offers"]]
    assert spots == sorted(spots)
    plan = sojourn("plan", ws, "--to", "gcp:n4-standard-8@us-central1:spot", "--remaining", "5h", "--repo", repo)
    assert "measured by capture" in plan.stdout and "none measured" not in plan.stdout
    text = sojourn("offers", "--gpu", "A100", "--spot", "--workspace", ws, "--repo", repo, "--limit", "0").stdout
    assert "SAVES?" in text and "measured" in text and "prices dated unknown" in text


def test_offers_without_a_measured_speed_say_it_is_assumed(repo: str) -> None:
    ws = make_workspace(repo, seconds_capture=None)
    data = json.loads(sojourn("offers", "--cpus", "2", "--memory", "4GiB", "--workspace", ws, "--repo", repo,
                              "--json").stdout)
    assert "assumed 50.0 MiB/s" in data["save_basis"]
    names = [o["offer"] for o in data["offers"]]
    assert "local:big" in names and "local:small" not in names  # 2 GiB < 4 GiB
    assert all(o["memory"] >= 4 * GIB for o in data["offers"])
    empty = sojourn("offers", "--gpu", "B200", "--repo", repo, check=False)
    assert empty.returncode == 0 and "no offer fits" in empty.stderr


def test_offers_list_every_configured_machine_of_every_provider(repo: str, tmp_path: Any) -> None:
    """ssh hosts and Slurm partitions are listed next to the local machines, at the machine's
    ``--price``. No daemon is needed: an ssh offer is read from the config (nothing is reached),
    and a Slurm that cannot be asked here (PATH without sinfo) is named in the caption while the
    other machines are still listed."""
    sojourn("machines", "set", "small", "--memory", "1GiB", "--price", "0.05", "--repo", repo)
    path = os.path.join(repo, "config", "machines.toml")
    with open(path) as f:
        body = f.read().rsplit("# sojourn-signature", 1)[0]
    with open(path, "w") as f:
        f.write(body + '\n[ssh.gpu1]\nhost = "gpu1.example"\ncpus = 8\nprice_per_hour = 9.0\n\n'
                '[slurm]\npartition = "debug"\n')
    sojourn("machines", "sign", "--repo", repo)
    sojourn("machines", "set", "gpu1", "--provider", "ssh", "--price", "0.30", "--repo", repo)
    env_path = str(tmp_path / "bin")
    os.mkdir(env_path)
    os.symlink(sys.executable, os.path.join(env_path, "python"))
    env = dict(os.environ, PYTHONPATH=str(SRC), COLUMNS="200", PATH=env_path)
    p = subprocess.run([sys.executable, "-m", "sojourn.cli.main", "offers", "--repo", repo, "--json"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    rows = {(r["provider"], r["name"]): r for r in data["offers"]}
    assert rows[("local", "small")]["price_per_hour"] == 0.05
    assert rows[("ssh", "gpu1")]["price_per_hour"] == 0.30  # the machine's --price, not the host table's
    assert rows[("ssh", "gpu1")]["cpus"] == 8 and rows[("ssh", "gpu1")]["region"] == "gpu1.example"
    assert "slurm: the Slurm client command" in data["caption"], data["caption"]
