"""The `sojourn run / resume / suspend / ps / show / logs` commands: exit codes, tables, JSON,
errors, and interpreters (real processes; the workflows are in tests/workspace)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import needs_python
from tests.workspace.conftest import Shell


@pytest.fixture
def sh(tmp_path: Path) -> Iterator[Shell]:
    s = Shell(tmp_path)
    yield s
    s.kill_all()


def test_exit_codes_are_the_scripts_own(sh: Shell) -> None:
    sh.write("ok.py", "print('hello')\n")
    sh.write("three.py", "import sys\nprint('bye')\nsys.exit(3)\n")
    sh.write("boom.py", "def f():\n    return 1 / 0\nprint('before')\nf()\n", prelude=False)
    ok = sh.cli("run", "ok.py")
    assert (ok.returncode, ok.stdout) == (0, "hello\n")
    assert ok.stderr.startswith("sojourn: workspace ws_") and "(ok) started" in ok.stderr
    three = sh.cli("run", "three.py")
    assert (three.returncode, three.stdout) == (3, "bye\n")
    boom = sh.cli("run", "--name", "boom", "boom.py")
    assert boom.returncode == 1 and boom.stdout == "before\n"
    assert "ZeroDivisionError: division by zero" in boom.stderr and 'boom.py", line 2, in f' in boom.stderr
    assert "/sojourn/" not in boom.stderr.split("Traceback")[1].split("ZeroDivisionError")[0]
    rows = {r["name"]: r for r in sh.json("ps")}
    assert rows["ok"]["state"] == "finished" and rows["three"]["state"] == "failed"
    assert rows["boom"]["state"] == "failed" and rows["boom"]["stop_reason"] == "failed"
    boom_rec = sh.show("boom")
    assert boom_rec["exit_code"] == 1 and "ZeroDivisionError" in boom_rec["detail"]
    assert boom_rec["next_action"]["action"] == "run-again"


def test_arguments_reach_the_script_and_the_default_name_is_unique(sh: Shell) -> None:
    sh.write("args.py", "import sys\nprint(sys.argv)\n")
    first = sh.cli("run", "args.py", "--epochs", "3", "-x")
    assert first.stdout == "['args.py', '--epochs', '3', '-x']\n", first.stderr
    second = sh.cli("run", "args.py")
    assert "(args-2) started" in second.stderr
    rec = sh.show("args")
    assert rec["command"]["argv"] == ["--epochs", "3", "-x"] and rec["command"]["cwd"] == str(sh.dir)


def test_ps_show_and_logs_as_tables_and_json(sh: Shell) -> None:
    sh.write("seed.py", "import sys\nfor i in range(6):\n    print(i, flush=True)\n    kill_here(i)\n"
             "print('warn', file=sys.stderr)\n")
    run = sh.cli("run", "--name", "seed", "seed.py", env={"KILLS": "2"})
    assert run.returncode == 75
    ps = sh.cli("ps")
    for col in ("WORKSPACE", "NAME", "STATE", "WHERE", "LAST CAPSULE", "SIZE"):
        assert col in ps.stdout
    assert "seed" in ps.stdout and "suspended" in ps.stdout
    [row] = sh.json("ps")
    assert set(row) >= {"id", "name", "state", "where", "last_capsule", "size", "updated"}
    assert row["where"].startswith("local:") and row["last_capsule"].startswith("cap_")
    res = sh.cli("resume", "seed")
    assert res.returncode == 0 and res.stdout == "3\n4\n5\n"
    show = sh.cli("show", "seed")
    assert show.returncode == 0
    for word in ("allocations", "capsules", "events", "finished", "epoch 2", "suspended", "created seed"):
        assert word in show.stdout, word
    rec = sh.show("seed")
    assert rec["state"] == "finished" and rec["name"] == "seed" and rec["epoch"] == 2
    assert [e["seq"] for e in rec["events"]] == list(range(1, len(rec["events"]) + 1))
    assert not any(e["stale"] for e in rec["events"])
    assert rec["requirements"]["python"] and rec["requirements"]["memory_high_water"] > 0
    assert len(rec["allocations"]) == 2 and rec["allocations"][1]["capsule_in"] == rec["capsules"][0]["id"]
    logs = sh.cli("logs", "seed")
    assert logs.stdout == "0\n1\n2\n3\n4\n5\n" and "warn" in logs.stderr and "paused (SIGTERM" in logs.stderr
    data = json.loads(sh.cli("logs", "seed", "--json", "--stream", "stdout").stdout)
    assert data["state"] == "finished" and "".join(r["text"] for r in data["records"]) == logs.stdout
    assert len({r["allocation"] for r in data["records"]}) == 2
    follow = sh.cli("logs", "seed", "--follow")
    assert follow.stdout == logs.stdout


def test_errors_are_one_clear_line(sh: Shell) -> None:
    sh.write("ok.py", "print('x')\n")
    assert sh.json("ps") == []  # no repository yet: nothing to list
    cases = [
        (("run", "missing.py"), "no script 'missing.py'"),
        (("run", "--repo", "memory://x", "ok.py"), "memory:// repository lives inside one process"),
        (("run", "--memory", "lots", "ok.py"), "cannot read the size 'lots'"),
        (("run", "--python", "/no/such/python", "ok.py"), "no Python interpreter"),
    ]
    for args, message in cases:
        p = sh.cli(*args)
        assert p.returncode == 2, (args, p.stderr)
        assert p.stderr.startswith("sojourn: error: ") and message in p.stderr, p.stderr
        assert "Traceback" not in p.stderr
    assert sh.cli("run", "--name", "one", "ok.py").returncode == 0
    nope = sh.cli("show", "nope")
    assert nope.returncode == 2 and nope.stderr.startswith("sojourn: error: no workspace 'nope' in ")
    taken = sh.cli("run", "--name", "one", "ok.py")
    assert taken.returncode == 2 and "the name 'one' is taken by workspace ws_" in taken.stderr
    done = sh.cli("resume", "one")
    assert done.returncode == 2 and "has finished; there is nothing to resume" in done.stderr
    not_running = sh.cli("suspend", "one")
    assert not_running.returncode == 2 and "is not running (finished" in not_running.stderr


def test_resume_keeps_the_interpreter_and_python_changes_it(sh: Shell) -> None:
    py312 = needs_python("3.12")
    sh.write("seed.py", "import sys\nfor i in range(8):\n    print(i, sys.version_info[:2], flush=True)\n"
             "    kill_here(i)\n")
    run = sh.cli("run", "--python", py312, "seed.py", env={"KILLS": "2,5"})
    assert run.returncode == 75, run.stderr
    assert run.stdout.splitlines()[0] == "0 (3, 12)"
    ws = sh.show_id(run.stderr)
    again = sh.cli("resume", ws)  # the interpreter the workspace last ran with
    assert again.returncode == 75 and again.stdout.splitlines()[0] == "3 (3, 12)", again.stderr
    here = sh.cli("resume", ws, "--python", needs_python("3.11"))
    assert here.returncode == 0, here.stderr
    assert here.stdout.splitlines() == ["6 (3, 11)", "7 (3, 11)"]
    rec = sh.show(ws)
    assert [a["python_version"][:4] for a in rec["allocations"]] == ["3.12", "3.12", "3.11"]
