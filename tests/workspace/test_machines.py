"""`sojourn machines`, `run --on`, `resume --on`, the hard stop and `--detach`, with real
processes, real memory limits and real interpreters."""

from __future__ import annotations

import os
import platform
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import interpreters
from tests.workspace.conftest import Shell, wait_for

SLOW = """
import time
with open("data.txt") as f:
    base = f.read().strip()
total = 0
for i in range(24):
    total += i
    print(i, base, total, flush=True)
    time.sleep(0.1)
print("done", total)
"""

OOM = """
import numpy as np
parts = []
for i in range(4):
    print("step", i, flush=True)
    parts.append(np.ones((600 if i == 2 else 10) << 20, dtype=np.uint8))
print("total", sum(int(p.sum()) for p in parts))
"""


def machines(sh: Shell, *args: str) -> None:
    p = sh.cli("machines", "set", *args)
    assert p.returncode == 0, p.stderr


def test_config_round_trip_and_the_machines_table(sh: Shell) -> None:
    listed = sh.json("machines")
    assert [m["name"] for m in listed] == ["local"] and not listed[0]["configured"]
    assert listed[0]["memory"] is None and listed[0]["python_path"] == sys.executable
    machines(sh, "small", "--memory", "2GiB", "--cpus", "1", "--python", "python3", "--price", "0.10",
             "--max-duration", "90m")
    machines(sh, "big", "--memory", "16GiB", "--python", sys.executable, "--price", "0.80")
    machines(sh, "big", "--memory", "none")  # changes only what is given
    toml = Path(sh.repo, "config", "machines.toml").read_text()
    assert '[machines.small]\nmemory = "2GiB"\ncpus = 1\npython = "python3"\nprice_per_hour = 0.1\nmax_duration = "90m"' \
        in toml
    rows = {m["name"]: m for m in sh.json("machines")}
    assert set(rows) == {"local", "small", "big"}
    assert rows["small"]["memory"] == 2 << 30 and rows["small"]["cpus"] == 1 and rows["small"]["max_duration"] == 5400
    assert rows["small"]["python_version"] and rows["small"]["python_path"].startswith("/")
    assert rows["big"]["memory"] is None and rows["big"]["price_per_hour"] == 0.8
    table = sh.cli("machines")
    assert table.returncode == 0
    for text in ("NAME", "PRICE/H", "small", "2.0 GiB", "$0.10", "$0.80", "no limit", "90m",
                 platform.python_version()):
        assert text in table.stdout, table.stdout
    assert sh.cli("machines", "remove", "big").returncode == 0
    assert {m["name"] for m in sh.json("machines")} == {"local", "small"}
    gone = sh.cli("machines", "remove", "big")
    assert gone.returncode == 2 and "no machine 'big'" in gone.stderr
    bad = sh.cli("machines", "set", "small", "--memory", "lots")
    assert bad.returncode == 2 and "cannot read the size 'lots'" in bad.stderr


def test_unknown_machine_and_missing_interpreter_are_clear_errors(sh: Shell) -> None:
    sh.write("hello.py", 'print("hi")\n', prelude=False)
    p = sh.cli("run", "--on", "nowhere", "hello.py")
    assert p.returncode == 2 and "no machine 'nowhere'" in p.stderr and "sojourn machines set nowhere" in p.stderr
    machines(sh, "ghost", "--python", "/no/such/python3.99")
    listed = sh.cli("machines")
    assert "MISSING" in listed.stdout and "no Python interpreter '/no/such/python3.99'" in listed.stderr
    p = sh.cli("run", "--on", "ghost", "hello.py")
    assert p.returncode == 2 and "machine 'ghost': no Python interpreter '/no/such/python3.99'" in p.stderr
    assert sh.json("ps") == []  # nothing was started
    both = sh.cli("run", "--on", "local", "--memory", "1G", "hello.py")
    assert both.returncode == 2 and "sojourn machines set" in both.stderr


def test_run_on_a_machine_uses_a_copy_of_the_files_in_its_scratch_directory(sh: Shell) -> None:
    others = [py for v, py in sorted(interpreters().items()) if v != f"{sys.version_info[0]}.{sys.version_info[1]}"]
    python = others[0] if others else sys.executable
    machines(sh, "small", "--cpus", "1", "--python", python, "--price", "3600")
    (sh.dir / "data.txt").write_text("payload 42\n")
    (sh.dir / ".git").mkdir()
    (sh.dir / ".git" / "HEAD").write_text("ref\n")
    (sh.dir / "big.bin").write_bytes(os.urandom(3 << 20))
    sh.write("job.py", """
        import os, sys
        print(open("data.txt").read().strip(), flush=True)
        print("python", f"{sys.version_info[0]}.{sys.version_info[1]}", "cpus", len(os.sched_getaffinity(0)), flush=True)
        print("git" if os.path.exists(".git") else "no git", flush=True)
        open("result.txt", "w").write("written on the machine")
    """, prelude=False)
    p = sh.cli("run", "--on", "small", "job.py")
    assert p.returncode == 0, p.stderr
    version = next(v for v, py in interpreters().items() if py == python)
    assert p.stdout.splitlines() == ["payload 42", f"python {version} cpus 1", "no git"]
    assert not (sh.dir / "result.txt").exists()  # it ran elsewhere
    ws = sh.show_id(p.stderr)
    rec = sh.show(ws)
    a = rec["allocations"][0]
    scratch = Path(a["scratch"])
    assert scratch == Path(os.environ["SOJOURN_HOME"]) / "machines" / "small" / a["id"]
    assert (scratch / "data.txt").read_text() == "payload 42\n" and (scratch / "big.bin").stat().st_size == 3 << 20
    assert (scratch / "result.txt").read_text() == "written on the machine" and not (scratch / ".git").exists()
    assert a["provider"] == "local" and a["machine"] == "small" and a["offer"]["price_per_hour"] == 3600
    assert a["python"] == os.path.abspath(python) and a["python_version"].startswith(version)
    assert a["handle"]["data"]["pid"] == a["pid"] and a["stop_reason"] == "finished"
    # Spend: the price times the allocation's wall time (3600 $/h = 1 $/s).
    assert 0.05 < a["spend"] < (a["ended"] - a["started"]) + 0.5
    files = {f["path"]: f for f in rec["file_list"]}
    assert set(files) == {"data.txt", "big.bin", "job.py"}
    assert files["data.txt"]["size"] == 11 and files["data.txt"]["mode"] == 0o644 and len(files["data.txt"]["hash"]) == 64
    assert rec["files"]["source"] == str(sh.dir) and rec["files"]["count"] == 3
    shown = sh.cli("show", ws)
    assert "data.txt" in shown.stdout and "machines" in shown.stdout and str(scratch)[:30] in shown.stdout
    ps = sh.json("ps")
    assert ps[0]["spend"] == pytest.approx(a["spend"]) and ps[0]["where"] == "local:small"


def test_out_of_memory_on_small_then_resume_on_big(sh: Shell) -> None:
    machines(sh, "small", "--memory", "400MiB", "--price", "0.10")
    machines(sh, "big", "--price", "0.80")
    sh.write("oom.py", OOM, prelude=False)
    expected = sh.plain("oom.py")
    run = sh.cli("run", "--on", "small", "oom.py")
    assert run.returncode == 77, run.stderr
    assert "ran out of memory" in run.stderr
    ws = sh.show_id(run.stderr)
    rec = sh.show(ws)
    assert rec["stop_reason"] == "oom" and rec["state"] == "suspended"
    assert rec["allocations"][0]["memory_limit"] == 400 << 20 and rec["allocations"][0]["machine"] == "small"
    res = sh.cli("resume", ws, "--on", "big")
    assert res.returncode == 0, res.stderr
    assert run.stdout + res.stdout == expected
    rec = sh.show(ws)
    assert rec["state"] == "finished"
    assert [(a["machine"], a["stop_reason"]) for a in rec["allocations"]] == [("small", "oom"), ("big", "finished")]
    assert rec["allocations"][1]["memory_limit"] is None


def test_hard_stop_suspends_and_resume_finishes_like_an_unmoved_run(sh: Shell) -> None:
    machines(sh, "small", "--price", "0.10", "--max-duration", "1s")
    machines(sh, "big", "--price", "0.80")
    (sh.dir / "data.txt").write_text("base\n")
    sh.write("slow.py", SLOW, prelude=False)
    expected = sh.plain("slow.py")
    run = sh.cli("run", "--on", "small", "slow.py")  # the machine's default hard stop
    assert run.returncode == 75, run.stderr
    assert "hard stop" in run.stderr
    ws = sh.show_id(run.stderr)
    rec = sh.show(ws)
    a = rec["allocations"][0]
    assert rec["state"] == "suspended" and rec["stop_reason"] == "hard-stop" and a["stop_reason"] == "hard-stop"
    assert "hard stop after 1 s" in a["detail"] and a["hard_stop"] == pytest.approx(a["started"] + 1, abs=0.01)
    assert any(e["type"] == "request" and e["kind"] == "hard-stop" for e in rec["events"])
    assert 0 < len(run.stdout.splitlines()) < 24
    # The capsule carries the scratch directory's files: resuming on another machine finds them.
    res = sh.cli("resume", ws, "--on", "big", "--max-duration", "1h")
    assert res.returncode == 0, res.stderr
    assert run.stdout + res.stdout == expected
    rec = sh.show(ws)
    b = rec["allocations"][1]
    assert b["machine"] == "big" and b["hard_stop"] == pytest.approx(b["started"] + 3600, abs=0.01)
    assert Path(b["scratch"], "data.txt").read_text() == "base\n"
    assert rec["files"]["capsule"] == rec["capsules"][0]["id"]  # the manifest travelled with the capsule
    assert sh.cli("logs", ws, "--stream", "stdout").stdout == expected


def test_hard_stop_kills_a_session_that_cannot_pause(sh: Shell) -> None:
    sh.write("stuck.py", """
        import threading, time
        print("start", flush=True)
        worker = threading.Thread(target=time.sleep, args=(120,), daemon=True)
        worker.start()
        for i in range(600):
            time.sleep(0.1)
    """, prelude=False)
    t0 = time.monotonic()
    p = sh.cli("run", "--on", "local", "--max-duration", "1s", "stuck.py", env={"SOJOURN_HARD_STOP_GRACE": "1"})
    assert time.monotonic() - t0 < 40
    assert p.returncode == 76, p.stderr
    ws = sh.show_id(p.stderr)
    rec = sh.show(ws)
    assert rec["stop_reason"] == "hard-stop" and rec["state"] == "failed"
    # The pause is refused (the thread cannot travel): the session is stopped at once, and
    # the stop says why, with the object's path.
    assert "the session was stopped" in rec["detail"] and "worker" in rec["detail"], rec["detail"]
    assert rec["allocations"][0]["ended"] is not None


def test_detach_returns_at_once_and_logs_follow_it(sh: Shell) -> None:
    machines(sh, "big", "--price", "0.80")
    (sh.dir / "data.txt").write_text("base\n")
    sh.write("slow.py", SLOW, prelude=False)
    expected = sh.plain("slow.py")
    t0 = time.monotonic()
    p = sh.cli("run", "--on", "big", "--detach", "slow.py")
    assert p.returncode == 0, p.stderr
    assert time.monotonic() - t0 < 10
    ws = p.stdout.strip()
    assert ws.startswith("ws_") and f"sojourn logs -f {ws}" in p.stderr
    rec = sh.show(ws)
    a = rec["allocations"][0]
    assert rec["state"] == "running" and a["machine"] == "big" and a["pid"] != os.getpid()
    follow = sh.cli("logs", "-f", ws)
    assert follow.returncode == 0 and follow.stdout == expected
    rec = sh.show(ws)
    assert rec["state"] == "finished" and rec["allocations"][0]["stop_reason"] == "finished"
    log = Path(a["scratch"]).parent / f"{a['id']}.log"
    assert "finished" in log.read_text()


def test_detached_session_suspends_and_resumes_on_its_machine(sh: Shell) -> None:
    machines(sh, "small", "--price", "0.10")
    (sh.dir / "data.txt").write_text("base\n")
    sh.write("slow.py", SLOW.replace("range(24)", "range(60)"), prelude=False)
    expected = sh.plain("slow.py")
    ws = sh.cli("run", "--on", "small", "--detach", "slow.py").stdout.strip()
    wait_for(lambda: sh.cli("logs", ws).stdout.count("\n") >= 3, 30, "some output")
    sus = sh.cli("suspend", ws)
    assert sus.returncode == 0, sus.stderr
    res = sh.cli("resume", ws)  # back on small: the machine it last ran on
    assert res.returncode == 0, res.stderr
    assert "on small" in res.stderr
    assert sh.cli("logs", ws, "--stream", "stdout").stdout == expected
    rec = sh.show(ws)
    assert [(a["machine"], a["stop_reason"]) for a in rec["allocations"]] == [("small", "suspended"),
                                                                             ("small", "finished")]


HAND_WRITTEN = """# our cluster: ask ops before changing the partition
[slurm]
partition = "debug"   # the only one with short jobs

[ssh.gpu1]
host = "gpu1.example"

[machines.small]
memory = "2GiB"
price_per_hour = 0.10  # list price
"""


def test_machines_set_edits_only_what_it_was_asked_and_keeps_hand_written_tables(sh: Shell) -> None:
    from sojourn.providers.slurm import provider_config
    from sojourn.repository.repo import open_repository

    machines(sh, "local", "--price", "0")  # creates the repository and a config
    path = Path(sh.repo, "config", "machines.toml")
    path.write_text(HAND_WRITTEN)
    refused = sh.cli("machines", "set", "small", "--cpus", "2")
    assert refused.returncode == 2 and "not signed" in refused.stderr and "[slurm], [ssh]" in refused.stderr
    assert path.read_text() == HAND_WRITTEN  # nothing written
    assert sh.cli("machines", "sign").returncode == 0
    machines(sh, "small", "--cpus", "2")
    machines(sh, "big", "--memory", "16GiB", "--price", "0.8")
    text = path.read_text()
    body = text[:text.rindex("# sojourn-signature")]
    assert body.startswith(HAND_WRITTEN + "cpus = 2\n"), body  # a new key goes at the end of its table
    assert '[machines.big]\nmemory = "16GiB"\nprice_per_hour = 0.8\n' in body
    with open_repository(sh.repo) as r:  # still signed: the hand-written tables are in force
        assert provider_config(r, "slurm") == {"partition": "debug"}
        assert provider_config(r, "ssh") == {"gpu1": {"host": "gpu1.example"}}
    rows = {m["name"]: m for m in sh.json("machines")}
    assert rows["small"]["cpus"] == 2 and rows["small"]["price_per_hour"] == 0.1 and rows["small"]["memory"] == 2 << 30
    assert sh.cli("machines", "remove", "big").returncode == 0
    assert "[machines.big]" not in path.read_text() and "# the only one with short jobs" in path.read_text()
