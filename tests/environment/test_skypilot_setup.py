"""A SkyPilot launch builds the captured environment in its ``setup``: the workspace's last
capsule's recorded distributions, on its Python version, with uv, and the run command uses
that environment's interpreter. The setup script is then run for real (bash, uv, a fresh
HOME) and the capsule restores in what it built. Only the cloud call is faked (FakeSky)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sojourn.providers.base import LaunchSpec, Requirements
from sojourn.providers.skypilot import SkyPilotProvider
from tests.conftest import ROOT
from tests.providers.test_skypilot import FakeSky
from tests.workspace.conftest import Shell

PROGRAM = """
import dateutil.relativedelta as rd
d = rd.relativedelta(days=1)
for i in range(3):
    d = d + rd.relativedelta(days=1)
    kill_here(i)
"""


@pytest.fixture
def sh(tmp_path: Path) -> Iterator[Shell]:
    s = Shell(tmp_path)
    yield s
    s.kill_all()


def _task(sh: Shell, config: dict[str, str]) -> tuple[object, str, str]:
    pytest.importorskip("dateutil")
    from sojourn.repository.repo import open_repository

    sh.write("dates.py", PROGRAM)
    run = sh.cli("run", "--name", "dates", "dates.py", env={"KILLS": "1"})
    assert run.returncode == 75, run.stderr
    rec = sh.show("dates")
    ws, cap = rec["id"], rec["capsules"][-1]["id"]
    with open_repository(sh.repo) as r:
        p = SkyPilotProvider(r, config=config, sky_module=FakeSky())
        offer = p.offers(Requirements())[0]
        task = p.task(offer, LaunchSpec(ws, "al_0123456789ab", ["python3", "-m", "sojourn.workspace.supervise",
                                                                 "--workspace", ws], hard_stop=3600))
    return task, ws, cap


def test_setup_installs_the_recorded_environment(sh: Shell) -> None:
    task, _ws, _cap = _task(sh, {})
    setup, run = task.setup, task.run  # type: ignore[attr-defined]
    import importlib.metadata as md

    install = next(ln for ln in setup.splitlines() if "uv pip install" in ln).split()
    assert f"python-dateutil=={md.version('python-dateutil')}" in install and f"six=={md.version('six')}" in install
    assert f"uv venv --quiet --python {sys.version_info[0]}.{sys.version_info[1]} " in setup  # the capsule's
    assert "'sojourn[numpy]'" in setup and "command -v uv" in setup
    env_python = setup.split("ready: ")[1].split('"')[0].replace("$ENV", "")
    assert env_python == "/bin/python"
    assert 'timeout -s TERM -k 60s 3600s "$HOME"/.cache/sojourn/envs/' in run and "/bin/python -m sojourn" in run


@pytest.mark.slow
def test_the_setup_script_builds_an_environment_the_capsule_restores_in(sh: Shell, tmp_path: Path) -> None:
    from sojourn.environment.build import find_uv

    try:
        uv = find_uv()
    except Exception as e:
        pytest.skip(str(e))
    # sojourn from this checkout (on a VM: an index, a wheel URL); built once by uv.
    task, _ws, cap = _task(sh, {"sojourn": f"sojourn @ file://{ROOT}"})
    home = tmp_path / "vmhome"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HOME=str(home), PATH=os.path.dirname(uv) + os.pathsep + env["PATH"])
    setup = subprocess.run(["bash", "-c", task.setup], env=env, capture_output=True, text=True,  # type: ignore[attr-defined]
                           timeout=600, cwd=home)
    assert setup.returncode == 0, setup.stderr[-3000:]
    assert "[3/3] environment" in setup.stderr
    [python] = list(home.glob(".cache/sojourn/envs/*/bin/python"))
    # The session's own check (as `sojourn verify` does for a paused program): sources found,
    # the capsule restored in the built environment, every fingerprint compared.
    check = subprocess.run([str(python), "-m", "sojourn.execution", "--repo", sh.repo, "check", cap], env=env,
                           capture_output=True, text=True, timeout=120, cwd=sh.dir)
    assert check.returncode == 0 and '"ok": true' in check.stdout, check.stdout + check.stderr
    where = subprocess.run([str(python), "-c", "import sojourn, dateutil; print(sojourn.__file__)"], env=env,
                           capture_output=True, text=True, timeout=60, cwd=home).stdout
    assert str(home) in where  # the environment's own sojourn, not this checkout's
    again = subprocess.run(["bash", "-c", task.setup], env=env, capture_output=True, text=True,  # type: ignore[attr-defined]
                           timeout=120, cwd=home)
    assert again.returncode == 0 and "[1/3]" not in again.stderr  # built once per key
