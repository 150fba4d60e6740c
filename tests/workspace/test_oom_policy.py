"""The out-of-memory policy with real machines: ``small`` has a memory limit a numpy
allocation exceeds, ``big`` has none. The policy picks ``big`` (the cheapest machine with more
memory than the high-water mark); with ``oom=perform`` it resumes there itself, and the output
equals an unmoved run's. Also: the hard stop fires and suspends, and no policy resumes that."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from tests.workspace.conftest import Shell, wait_for

OOM = """
import numpy as np
parts = []
for i in range(4):
    print("step", i, flush=True)
    parts.append(np.ones((600 if i == 2 else 10) << 20, dtype=np.uint8))
print("total", sum(int(p.sum()) for p in parts))
"""

SLOW = """
import time
total = 0
for i in range(40):
    total += i
    print(i, total, flush=True)
    time.sleep(0.1)
print("done", total)
"""


def machines(sh: Shell) -> None:
    for args in (("small", "--memory", "400MiB", "--price", "0.10"), ("big", "--price", "0.80"),
                 ("huge", "--price", "2.50")):
        p = sh.cli("machines", "set", *args)
        assert p.returncode == 0, p.stderr
    # The default `local` machine (no limit, price 0) would be the cheapest with more memory.
    assert sh.cli("machines", "remove", "local").returncode == 0


def events(sh: Shell, ws: str, kind: str) -> list[dict[str, Any]]:
    return [e for e in sh.show(ws)["events"] if e["type"] == kind]


def home(sh: Shell, tmp_path: Path) -> None:
    sh.env["SOJOURN_HOME"] = str(tmp_path / "home")


def no_watcher_left(sh: Shell, ws: str, timeout: float = 30) -> None:
    """The watcher of ``ws`` (if one ran) has exited and removed its marker."""
    marker = Path(sh.repo, "workspaces", f"policy.{ws}.watcher")

    def gone() -> bool:
        if not marker.exists():
            return True
        pid = json.loads(marker.read_text())["pid"]
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False

    wait_for(gone, timeout, f"the policy watcher of {ws} to exit")


def test_oom_on_small_proposes_big_and_resume_there_finishes(sh: Shell, tmp_path: Path) -> None:
    home(sh, tmp_path)
    machines(sh)
    sh.write("oom.py", OOM, prelude=False)
    expected = sh.plain("oom.py")
    run = sh.cli("run", "--on", "small", "oom.py")
    assert run.returncode == 77, run.stderr
    ws = sh.show_id(run.stderr)
    assert "policy: resume on local:big (memory " in run.stderr, run.stderr
    assert f"`sojourn resume {ws} --on big`" in run.stderr
    [ev] = events(sh, ws, "policy")
    assert ev["policy"] == "oom" and ev["action"] == "propose-resume" and not ev["spends"]
    assert ev["target"] == "local:big" and ev["machine"] == "big"  # not huge: dearer; not small: 400 MiB
    n = ev["numbers"]
    assert n["memory_limit"] == 400 << 20 and n["memory_needed_over"] >= 400 << 20
    assert n["target_memory"] > n["memory_needed_over"]
    rec = sh.show(ws)
    assert rec["state"] == "suspended" and rec["allocations"][0]["machine"] == "small"
    # Nothing was resumed: proposals spend nothing.
    assert len(rec["allocations"]) == 1
    # The foreground run on a machine records its four launch checks.
    checks = [(e["check"], e["outcome"]) for e in events(sh, ws, "launch-check")]
    assert checks == [("catalog", "passed"), ("permission", "skipped"), ("capacity", "skipped"), ("launch", "passed")]
    res = sh.cli("resume", ws, "--on", "big")
    assert res.returncode == 0, res.stderr
    assert run.stdout + res.stdout == expected
    # A second look at the same stop decides nothing new (the stop was claimed once).
    assert len(events(sh, ws, "policy")) == 1


def test_oom_perform_resumes_on_big_in_the_foreground(sh: Shell, tmp_path: Path) -> None:
    home(sh, tmp_path)
    machines(sh)
    sh.write("oom.py", OOM, prelude=False)
    expected = sh.plain("oom.py")
    run = sh.cli("run", "--on", "small", "--policy", "oom=perform", "oom.py")
    assert run.returncode == 0, run.stderr
    assert run.stdout == expected  # one command, across both machines, like an unmoved run
    ws = sh.show_id(run.stderr)
    assert "policy oom=perform: resume on local:big" in run.stderr and "resuming now" in run.stderr
    rec = sh.show(ws)
    assert rec["state"] == "finished"
    assert [(a["machine"], a["stop_reason"]) for a in rec["allocations"]] == [("small", "oom"), ("big", "finished")]
    [settings] = events(sh, ws, "policy-settings")
    assert settings["settings"] == {"oom": "perform"}
    [ev] = events(sh, ws, "policy")
    assert ev["action"] == "resume" and ev["spends"] and ev["target"] == "local:big"
    [result] = events(sh, ws, "policy-result")
    assert result["outcome"] == "resumed" and result["machine"] == "big"
    assert result["allocation"] == rec["allocations"][1]["id"]
    assert sh.cli("logs", ws, "--stream", "stdout").stdout == expected


def test_oom_perform_on_a_detached_run_is_the_watchers(sh: Shell, tmp_path: Path) -> None:
    """No foreground command sees the stop: the watcher settles it and resumes on big in the
    background; it exits once the workspace has finished."""
    home(sh, tmp_path)
    machines(sh)
    sh.write("oom.py", OOM, prelude=False)
    expected = sh.plain("oom.py")
    p = sh.cli("run", "--on", "small", "--detach", "--policy", "oom=perform", "--policy", "watch=on",
               "--policy", "interval=1s", "oom.py")
    assert p.returncode == 0, p.stderr
    ws = p.stdout.strip()
    try:
        wait_for(lambda: sh.show(ws)["state"] == "finished", 90, "the workspace to finish on big")
        rec = sh.show(ws)
        assert [(a["machine"], a["stop_reason"]) for a in rec["allocations"]] == [("small", "oom"),
                                                                                 ("big", "finished")]
        assert sh.cli("logs", ws, "--stream", "stdout").stdout == expected
        [ev] = [e for e in events(sh, ws, "policy") if e["policy"] == "oom"]
        assert ev["action"] == "resume" and ev["by"] == "policy:watcher"
        # While it ran, the watcher recorded what the other policies thought, once each.
        quiet = {e["policy"]: e for e in events(sh, ws, "policy") if e["policy"] != "oom"}
        assert quiet["auto-move"]["action"] == "none" and "no estimate of the remaining time" in \
            quiet["auto-move"]["reason"]
        assert quiet["gpu-idle"]["action"] == "none"
        # Both allocations went through the local provider: four checks each.
        assert len(events(sh, ws, "launch-check")) == 8
    finally:
        no_watcher_left(sh, ws)


def test_hard_stop_fires_and_suspends_and_no_policy_resumes_it(sh: Shell, tmp_path: Path) -> None:
    home(sh, tmp_path)
    machines(sh)
    sh.write("slow.py", SLOW, prelude=False)
    expected = sh.plain("slow.py")
    t0 = time.monotonic()
    run = sh.cli("run", "--on", "big", "--max-duration", "1s", "--policy", "oom=perform", "--policy", "watch=on",
                 "slow.py")
    assert run.returncode == 75, run.stderr
    assert time.monotonic() - t0 < 60
    ws = sh.show_id(run.stderr)
    rec = sh.show(ws)
    assert rec["state"] == "suspended" and rec["stop_reason"] == "hard-stop"
    assert any(e["type"] == "request" and e["kind"] == "hard-stop" for e in rec["events"])
    no_watcher_left(sh, ws)
    assert len(sh.show(ws)["allocations"]) == 1  # oom=perform acts on out-of-memory stops only
    assert not [e for e in events(sh, ws, "policy") if e["action"] != "none"]
    res = sh.cli("resume", ws, "--max-duration", "1h")
    assert res.returncode == 0, res.stderr
    assert run.stdout + res.stdout == expected
    no_watcher_left(sh, ws)
