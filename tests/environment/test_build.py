"""A destination without the capsule's libraries gets them: `sojourn resume --build-env` onto
a bare interpreter (no sojourn dependencies, no python-dateutil) builds a uv environment,
cached by its key, and the program carries on there. Real uv, real PyPI (or uv's cache)."""

from __future__ import annotations

import glob
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.workspace.conftest import Shell

PROGRAM = """
import dateutil.relativedelta as rd
d = rd.relativedelta(days=1)
for i in range(4):
    d = d + rd.relativedelta(days=1)
    print(i, d.days, flush=True)
    kill_here(i)
"""


def _destination_log(stderr: str) -> str:
    """The destination's own log, named in a failed move's message (what it said before it died)."""
    import re

    m = re.search(r"destination's log: ([^)]+)\)", stderr)
    if not m or not Path(m.group(1)).exists():
        return ""
    return "\n--- destination's log\n" + Path(m.group(1)).read_text(errors="replace")[-6000:]


def bare_python(version: str = "3.12") -> str:
    found = sorted(glob.glob(str(Path.home() / f".pyenv/versions/{version}.*/bin/python{version}")))
    if not found:
        pytest.skip(f"no bare Python {version} (pyenv) on this machine")
    return found[-1]


@pytest.fixture
def sh(tmp_path: Path) -> Iterator[Shell]:
    s = Shell(tmp_path)
    s.env["SOJOURN_ENV_CACHE"] = str(tmp_path / "envs")
    yield s
    s.kill_all()


@pytest.mark.slow
def test_resume_onto_a_bare_interpreter_builds_the_environment(sh: Shell, tmp_path: Path) -> None:
    pytest.importorskip("dateutil")
    from sojourn.environment.build import find_uv

    try:
        find_uv()
    except Exception as e:
        pytest.skip(str(e))
    bare = bare_python()
    sh.write("dates.py", PROGRAM)
    run = sh.cli("run", "--name", "dates", "dates.py", env={"KILLS": "1"})
    assert run.returncode == 75 and run.stdout == "0 2\n1 3\n", run.stderr

    refused = sh.cli("resume", "dates", "--python", bare)
    assert refused.returncode != 0 and refused.stdout == ""
    [line] = [ln for ln in refused.stderr.splitlines() if ln.strip()]
    assert "python-dateutil 2.9" in line and "(module dateutil)" in line and "'d'" in line and "--build-env" in line
    assert sh.show("dates")["state"] == "suspended"  # nothing was started

    t0 = time.monotonic()
    built = sh.cli("resume", "dates", "--python", bare, "--build-env", timeout=600)
    cold = time.monotonic() - t0
    assert built.returncode == 0, built.stderr
    assert built.stdout == "2 4\n3 5\n"
    assert "sojourn env: [1/3] creating environment" in built.stderr and "[3/3]" in built.stderr
    env_python = built.stderr.split("ready in ")[1].split(": ", 1)[1].splitlines()[0]
    rec = sh.show("dates")
    assert rec["state"] == "finished" and rec["allocations"][-1]["python"] == env_python
    marker = json.loads((Path(env_python).parents[1] / "sojourn-env.json").read_text())
    assert any(r.startswith("python-dateutil==2.9") for r in marker["requirements"])
    assert marker["python"]["version"].startswith("3.12")

    # The same environment again: from the cache, no uv run.
    cap = rec["capsules"][0]["id"]
    t0 = time.monotonic()
    again = sh.cli("env", cap, "--python", bare, "--build")
    warm = time.monotonic() - t0
    assert again.returncode == 0 and again.stdout.strip() == env_python, again.stderr
    assert "is cached" in again.stderr and "[1/3]" not in again.stderr
    assert warm < cold
    # Another policy is another environment.
    plan = json.loads(sh.cli("env", cap, "--python", bare, "--mode", "compatible", "--json").stdout)
    assert plan["key"] not in env_python and any(">=" in r for r in plan["requirements"])


@pytest.mark.slow
def test_a_live_move_to_a_bare_interpreter_is_refused_then_built(tmp_path: Path) -> None:
    """`sojourn move WS --to BARE`: refused in one line (no sojourn there) with the program
    still running; with --build-env the destination runs in a built environment and the
    program's output equals an unmoved run."""
    from tests.workspace.test_move import mover

    bare = bare_python()
    sh = Shell(tmp_path)
    sh.env["SOJOURN_ENV_CACHE"] = str(tmp_path / "envs")
    for mv in mover(sh, tmp_path):
        run, ws = mv.start()
        refused = mv.move(ws, bare)
        assert refused.returncode != 0 and "lacks sojourn's own modules blake3" in refused.stderr, refused.stderr
        assert "--build-env" in refused.stderr and mv.record(ws)["state"] == "running"
        moved = mv.move(ws, bare, None, "--build-env")
        assert moved.returncode == 0, moved.stderr + _destination_log(moved.stderr)
        assert "sojourn env: [3/3] environment" in moved.stderr or "is cached" in moved.stderr
        run.wait(timeout=120)
        rec = mv.check_final(ws)
        src, dst = rec["allocations"]
        assert src["stop_reason"] == "moved" and dst["python"].startswith(str(tmp_path / "envs"))
        assert dst["python_version"].startswith("3.12")


@pytest.mark.slow
def test_verify_build_env_restores_a_capsule_on_a_bare_interpreter(sh: Shell, tmp_path: Path) -> None:
    """`sojourn verify CAP --python BARE --build-env`: the capsule (python-dateutil, captured
    here) restores in a built environment, every fingerprint equal; without it, refused."""
    pytest.importorskip("dateutil")
    bare = bare_python()
    sh.write("cap.py", "import sys, sojourn, dateutil.relativedelta as rd\n"
             "print(sojourn.capture({'d': rd.relativedelta(weeks=2)}, repo=sys.argv[1]).id)\n", prelude=False)
    cap = sh.plain("cap.py", sh.repo).strip()
    refused = sh.cli("verify", cap, "--python", bare)
    assert refused.returncode != 0 and "needs python-dateutil" in refused.stderr, refused.stderr
    ok = sh.cli("verify", cap, "--python", bare, "--build-env", timeout=600)
    assert ok.returncode == 0 and f"{cap}: OK" in ok.stdout and "Python 3.12" in ok.stdout, ok.stdout + ok.stderr
    assert "sojourn env: [3/3] environment" in ok.stderr


@pytest.mark.slow
def test_resume_on_a_local_machine_with_a_bare_python(sh: Shell) -> None:
    """`sojourn resume WS --on M`, M a `local` machine whose python lacks the capsule's
    library: refused by name; with --build-env it resumes in a built environment."""
    pytest.importorskip("dateutil")
    bare = bare_python()
    sh.write("dates.py", PROGRAM)
    assert sh.cli("run", "--name", "dates", "dates.py", env={"KILLS": "0"}).returncode == 75
    assert sh.cli("machines", "set", "bare", "--python", bare).returncode == 0
    refused = sh.cli("resume", "dates", "--on", "bare")
    assert refused.returncode != 0 and "needs python-dateutil" in refused.stderr and refused.stdout == ""
    built = sh.cli("resume", "dates", "--on", "bare", "--build-env", timeout=600)
    assert built.returncode == 0, built.stderr
    assert built.stdout == "1 3\n2 4\n3 5\n"
    assert sh.show("dates")["allocations"][-1]["python_version"].startswith("3.12")
