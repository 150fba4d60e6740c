"""Issue 6's pieces wired into the running system, with real processes: `run --cheapest`, the
four launch checks as workspace events, policy settings as events, auto-move performed by
the watcher (and not performed under the thresholds, nor without the switch), GPU idle with
a fake sampler, and `run --on` a Slurm machine recorded as provider `slurm`."""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sojourn.providers.base import Offer
from tests.providers.test_slurm import slurm_cluster  # noqa: F401 (the fixture: a real single-node Slurm)
from tests.workspace.conftest import Shell, wait_for
from tests.workspace.test_move import holders_alive

COUNT = """
import sys, time
n = int(sys.argv[1]) if len(sys.argv) > 1 else 60
total = 0
for i in range(n):
    total += i
    print(i, total, flush=True)
    time.sleep(0.1)
print("done", total)
"""


@pytest.fixture
def sh(tmp_path: Path) -> Iterator[Shell]:
    """A Shell whose every process (detached supervisors, watchers, move destinations) carries
    a tag; whatever still carries it at the end is killed, and that fails the test."""
    s = Shell(tmp_path)
    tag = uuid.uuid4().hex
    s.env["SOJOURN_TEST_TAG"] = tag
    s.env["SOJOURN_HOME"] = str(tmp_path / "home")
    yield s
    s.kill_all()
    try:
        wait_for(lambda: not holders_alive(tag), 30, "every process of the test to end")
    finally:
        left = holders_alive(tag)
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        assert not left, f"processes left behind: {left}"


def machines(sh: Shell, *specs: tuple[str, ...]) -> None:
    for args in specs:
        p = sh.cli("machines", "set", *args)
        assert p.returncode == 0, p.stderr
    p = sh.cli("machines", "remove", "local")  # the default machine (price 0) would win every choice
    assert p.returncode == 0, p.stderr


def events(sh: Shell, ws: str, kind: str) -> list[dict[str, Any]]:
    return [e for e in sh.show(ws)["events"] if e["type"] == kind]


def checks_of(evs: list[dict[str, Any]], al: str) -> list[tuple[str, str]]:
    return [(e["check"], e["outcome"]) for e in evs if e["allocation"] == al]


LOCAL_CHECKS = [("catalog", "passed"), ("permission", "skipped"), ("capacity", "skipped"), ("launch", "passed")]


# -- run --cheapest ----------------------------------------------------------------------------------


def test_run_cheapest_picks_the_cheapest_machine_that_fits(sh: Shell) -> None:
    # cheaper than any catalog row with 1 GiB, so a machine wins; `tiny` is cheaper but too small
    machines(sh, ("tiny", "--memory", "256MiB", "--price", "0.0001"), ("big", "--price", "0.001"),
             ("huge", "--price", "0.002"))
    sh.write("count.py", COUNT, prelude=False)
    expected = sh.plain("count.py", "5")
    p = sh.cli("run", "--cheapest", "--memory", "1GiB", "count.py", "5")
    assert p.returncode == 0, p.stderr
    assert p.stdout == expected
    assert "cheapest offer that fits: local:big ($0.001/h" in p.stderr and "machine big" in p.stderr
    ws = sh.show_id(p.stderr)
    rec = sh.show(ws)
    a = rec["allocations"][0]
    assert a["machine"] == "big" and a["memory_limit"] is None  # --memory was the requirement, not a limit
    assert checks_of(events(sh, ws, "launch-check"), a["id"]) == LOCAL_CHECKS


def test_run_cheapest_explains_an_offer_it_cannot_launch(sh: Shell) -> None:
    machines(sh, ("big", "--price", "0.80"))
    sh.write("count.py", COUNT, prelude=False)
    p = sh.cli("run", "--cheapest", "--gpu", "A100", "count.py")
    assert p.returncode == 2
    assert "the cheapest offer that fits is" in p.stderr and "A100" not in p.stderr.split("fits is")[0]
    assert "has no machine that launches it" in p.stderr and "skypilot" in p.stderr.lower()
    assert "sojourn machines set" in p.stderr
    none = sh.cli("run", "--cheapest", "--memory", "100000GiB", "count.py")
    assert none.returncode == 2 and "no offer fits (memory=" in none.stderr
    both = sh.cli("run", "--cheapest", "--on", "big", "count.py")
    assert both.returncode == 2 and "leave out --on" in both.stderr
    assert sh.json("ps") == []  # nothing was started


# -- settings --------------------------------------------------------------------------------------------


def test_policy_settings_are_events_and_defaults_spend_nothing(sh: Shell) -> None:
    machines(sh, ("big", "--price", "0.80"))
    sh.write("count.py", COUNT, prelude=False)
    p = sh.cli("run", "--on", "big", "count.py", "2")
    assert p.returncode == 0, p.stderr
    ws = sh.show_id(p.stderr)
    shown = sh.json("policy", ws, "show")
    cfg = shown["settings"]["config"]
    assert shown["settings"]["values"] == {} and not shown["settings"]["watch"]
    assert cfg["auto_move"] is False and cfg["oom"] == "propose" and cfg["gpu_idle"] == "propose"
    assert all(not d["spends"] for d in shown["now"])
    s = sh.json("policy", ws, "set", "auto_move=on", "oom=perform", "min_saving=25%", "min_factor=4",
                "gpu_idle=off", "interval=30s", "remaining=2h")
    v = s["settings"]["values"]
    assert v["auto_move"] is True and v["oom"] == "perform" and v["min_fraction"] == 0.25 and v["min_factor"] == 4
    assert v["gpu_idle"] == "off" and v["interval_s"] == 30 and v["remaining_s"] == 7200 and s["settings"]["watch"]
    again = sh.json("policy", ws, "set", "auto_move=off")  # changes only what is given
    assert again["settings"]["values"]["oom"] == "perform" and again["settings"]["values"]["auto_move"] is False
    evs = events(sh, ws, "policy-settings")
    assert [e["changed"] for e in evs][-1] == {"auto_move": False} and len(evs) == 2
    assert sh.json("policy", ws, "show")["settings"]["values"] == again["settings"]["values"]  # read back
    bad = sh.cli("policy", ws, "set", "auto_move=maybe")
    assert bad.returncode == 2 and "policy setting auto_move: 'maybe' is not on or off" in bad.stderr
    bad = sh.cli("policy", ws, "set", "speed=11")
    assert bad.returncode == 2 and "write NAME=VALUE with NAME one of auto_move" in bad.stderr
    table = sh.cli("policy", ws, "show")
    assert table.returncode == 0 and "oom         perform" in table.stdout and "REASON / OUTCOME" not in table.stdout


# -- auto-move ---------------------------------------------------------------------------------------------


def run_detached(sh: Shell, machine: str, n: int, *policies: str) -> str:
    args = [a for pol in policies for a in ("--policy", pol)]
    p = sh.cli("run", "--on", machine, "--detach", *args, "count.py", str(n))
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


def test_auto_move_moves_to_the_cheaper_machine_when_it_pays(sh: Shell) -> None:
    machines(sh, ("dear", "--price", "20"), ("cheap", "--price", "0.10"))
    sh.write("count.py", COUNT, prelude=False)
    expected = sh.plain("count.py", "60")
    ws = run_detached(sh, "dear", 60, "auto_move=on", "remaining=1h", "interval=1s")
    wait_for(lambda: sh.show(ws)["state"] == "finished", 90, "the workspace to finish")
    rec = sh.show(ws)
    assert [(a["machine"], a["stop_reason"]) for a in rec["allocations"]] == [("dear", "moved"), ("cheap", "finished")]
    assert sh.cli("logs", ws, "--stream", "stdout").stdout == expected  # like an unmoved run
    [d] = [e for e in events(sh, ws, "policy") if e["policy"] == "auto-move" and e["action"] == "move"]
    assert d["target"] == "local:cheap" and d["spends"] and d["allocation"] == rec["allocations"][0]["id"]
    n = d["numbers"]  # the numbers that decided it
    assert n["saving_fraction"] >= 0.2 and n["saving_usd"] >= 3 * n["move_usd"] > 0
    assert n["stay_usd"] == pytest.approx(20.0, rel=0.01) and n["min_fraction"] == 0.2 and n["min_factor"] == 3
    [r] = events(sh, ws, "policy-result")
    assert r["outcome"] == "moved" and r["machine"] == "cheap" and r["move"]
    # The move's destination recorded its four checks too.
    dest = rec["allocations"][1]["id"]
    assert checks_of(events(sh, ws, "launch-check"), dest) == [
        ("catalog", "passed"), ("permission", "skipped"), ("capacity", "skipped"), ("launch", "passed")]
    # On cheap, nothing cheaper is left: the next decision says so.
    last = [e for e in events(sh, ws, "policy") if e["policy"] == "auto-move"][-1]
    assert last["action"] == "none" and last["allocation"] == dest


def test_auto_move_under_the_thresholds_or_switched_off_moves_nothing(sh: Shell) -> None:
    machines(sh, ("dear", "--price", "0.11"), ("cheap", "--price", "0.10"), ("half", "--price", "0.05"))
    sh.write("count.py", COUNT, prelude=False)
    # 0.11 -> 0.10 saves 9%: under 20%, and `half` too when the bar is 60%.
    ws = run_detached(sh, "dear", 25, "auto_move=on", "remaining=1h", "interval=1s", "min_saving=60%")
    wait_for(lambda: sh.show(ws)["state"] == "finished", 60, "the workspace to finish")
    assert [a["machine"] for a in sh.show(ws)["allocations"]] == ["dear"]
    [d] = [e for e in events(sh, ws, "policy") if e["policy"] == "auto-move"]
    assert d["action"] == "none" and "is under 60%" in d["reason"] and d["numbers"]["saving_fraction"] < 0.6
    assert not events(sh, ws, "policy-result")
    # Paying, but auto_move is off: a proposal, nothing spent.
    ws = run_detached(sh, "dear", 25, "watch=on", "remaining=1h", "interval=1s")
    wait_for(lambda: sh.show(ws)["state"] == "finished", 60, "the workspace to finish")
    assert [a["machine"] for a in sh.show(ws)["allocations"]] == ["dear"]
    [d] = [e for e in events(sh, ws, "policy") if e["policy"] == "auto-move"]
    assert d["action"] == "propose-move" and d["target"] == "local:half" and not d["spends"]


# -- GPU idle -------------------------------------------------------------------------------------------------


def test_gpu_idle_proposes_a_cpu_machine_with_the_saving(sh: Shell, monkeypatch: pytest.MonkeyPatch) -> None:
    """There is no GPU on the build hosts: the sampler is a fake that reports 0 % utilization
    (then 90 %), and the offers are injected so that the running machine has a GPU."""
    from sojourn.ops.policyrun import GpuIdle, Watcher
    from sojourn.repository.repo import open_repository
    from sojourn.workspace.store import WorkspaceStore

    machines(sh, ("gpubox", "--price", "3.0"), ("cpu", "--price", "0.10"))
    sh.write("count.py", COUNT, prelude=False)
    ws = run_detached(sh, "gpubox", 300)
    monkeypatch.setenv("SOJOURN_HOME", sh.env["SOJOURN_HOME"])  # the repository's key is there
    offers = [Offer("local", "gpubox", cpus=8, memory=64 << 30, gpus=1, gpu="A10G", price_per_hour=3.0,
                    extra={"machine": "gpubox"}),
              Offer("local", "cpu", cpus=8, memory=64 << 30, price_per_hour=0.10, extra={"machine": "cpu"})]
    util = [0.0]
    now = [1000.0]
    w = Watcher(sh.repo, ws, offers=lambda: offers)
    w.gpu = GpuIdle(lambda: util[0], clock=lambda: now[0])
    try:
        with open_repository(sh.repo) as repo:
            store = WorkspaceStore(repo)
            wait_for(lambda: store.record(ws, save=False).current is not None, 30, "the allocation")
            w.gpu.sample()  # idle from t=1000
            now[0] += 600  # 10 min: under the 15 min default
            idle = {d.policy: d for d in w.tick(store)}["gpu-idle"]
            assert idle.action == "none" and "GPU idle 600 s < 900 s" in idle.reason
            now[0] += 400
            d = {d.policy: d for d in w.tick(store)}["gpu-idle"]
            assert d.action == "propose-move" and d.target is not None and d.target.name == "cpu"
            assert d.numbers["saving_per_hour"] == pytest.approx(2.9) and d.numbers["gpu_idle_s"] == 1000
            assert d.numbers["break_even_s"] > 0 and not d.spends
            util[0] = 90.0
            assert w.gpu.sample() == 0.0  # busy again: the idle stretch is over
    finally:
        sh.cli("suspend", ws)
    ev = [e for e in events(sh, ws, "policy") if e["policy"] == "gpu-idle"]
    assert [e["action"] for e in ev] == ["none", "propose-move"]  # each change once
    assert ev[-1]["target"] == "local:cpu" and ev[-1]["numbers"]["saving_per_hour"] == pytest.approx(2.9)
    assert "saves $2.9/h" in ev[-1]["reason"]


# -- Slurm machines ---------------------------------------------------------------------------------------


def test_run_on_a_slurm_machine_records_provider_slurm(sh: Shell, slurm_cluster: None,  # noqa: F811
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """`sojourn run --on debug` where `debug` is a Slurm partition in the machines config: the
    batch job runs the detached supervisor; the allocation says slurm, its job id and hard
    stop; suspend, then `resume` (back on the same Slurm machine) finishes like an unmoved run."""
    from sojourn import ops

    monkeypatch.setenv("SOJOURN_HOME", sh.env["SOJOURN_HOME"])
    ops.set_machine("debug", repo=sh.repo, provider="slurm", price_per_hour=0.05)
    # Held at line 10 until the test has suspended it: the checks below take several CLI
    # calls, and under load the 4 s program could end before the suspend.
    gate = Path(sh.dir, "go")
    held = COUNT.replace("    total += i\n", f"    while i == 10 and not __import__('os').path.exists({str(gate)!r}):\n"
                                                "        time.sleep(0.02)\n    total += i\n")
    sh.write("count.py", held, prelude=False)
    gate.touch()
    expected = sh.plain("count.py", "40")
    gate.unlink()
    p = sh.cli("run", "--on", "debug", "--max-duration", "10m", "count.py", "40", timeout=180)
    assert p.returncode == 0, p.stderr
    ws = p.stdout.strip()
    try:
        wait_for(lambda: sh.cli("logs", ws).stdout.count("\n") >= 5, 60, "the first lines from the Slurm job")
        rec = sh.show(ws)
        a = rec["allocations"][0]
        assert a["provider"] == "slurm" and a["machine"] == "debug" and a["price_per_hour"] == 0.05
        assert a["handle"]["data"]["job_id"].isdigit()
        assert a["hard_stop"] == pytest.approx(a["started"] + 600, abs=0.01)
        [check] = [e for e in events(sh, ws, "launch-check") if e["check"] == "launch"]
        assert check["outcome"] == "passed" and f"job_id={a['handle']['data']['job_id']}" in check["detail"]
        assert [e["check"] for e in events(sh, ws, "launch-check")] == ["catalog", "permission", "capacity", "launch"]
        script = Path(sh.env["SOJOURN_HOME"], "slurm", f"{a['id']}.sbatch").read_text()
        assert "#SBATCH --time=00:10:00" in script and "sojourn.workspace.supervise" in script
        sus = sh.cli("suspend", ws)
        assert sus.returncode == 0, sus.stderr
        gate.touch()
        res = sh.cli("resume", ws, timeout=180)  # back on debug, through Slurm again
        assert res.returncode == 0, res.stderr
        wait_for(lambda: sh.show(ws)["state"] == "finished", 120, "the resumed job to finish")
    finally:
        if sh.show(ws)["state"] == "running":
            sh.cli("suspend", ws)
    rec = sh.show(ws)
    assert [(a["provider"], a["stop_reason"]) for a in rec["allocations"]] == [("slurm", "suspended"),
                                                                              ("slurm", "finished")]
    assert rec["allocations"][1]["handle"]["data"]["job_id"] != rec["allocations"][0]["handle"]["data"]["job_id"]
    assert sh.cli("logs", ws, "--stream", "stdout").stdout == expected
