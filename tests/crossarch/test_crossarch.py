"""Capsules and paused programs move to another CPU and back: s390x (big-endian) and arm64.

Each test runs this tree's sojourn on the host (x86_64) and in a Debian rootfs under
qemu-user (``foreign.py``), so every move also crosses Python (3.11 -> 3.13) and numpy
(2.4 -> 2.2) versions. The s390x rootfs is built in CI (``.ci/run``, in the background
while the rest of the suite runs); arm64's only when it is there or required.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import KILL_PRELUDE, SRC
from tests.crossarch.foreign import Foreign, foreign

np = pytest.importorskip("numpy")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]  # may wait for the rootfs build

EXIT_PAUSED = 75
PROGRAM = Path(__file__).with_name("values_program.py")


@pytest.fixture(params=["s390x", "arm64"])
def machine(request: pytest.FixtureRequest) -> Foreign:
    return foreign(request.param)


def _binds(tmp_path: Path) -> list[Path]:
    return [tmp_path, Path(os.environ["SOJOURN_HOME"])]


def _host(args: list[str], cwd: Path) -> dict:
    p = subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=600,
                       env=_host_env())
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def _host_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(SRC) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _foreign(machine: Foreign, args: list[str], tmp_path: Path) -> dict:
    p = machine.run(["python3", *args], cwd=tmp_path, binds=_binds(tmp_path))
    assert p.returncode == 0, f"on {machine.arch}:\n{p.stdout}\n{p.stderr}"
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_values_restore_verify_and_come_back(machine: Foreign, tmp_path: Path) -> None:
    """Arrays (views, structured, Fortran, read-only, explicitly ordered, reinterpreted),
    numpy scalars and dtypes, ndarray subclasses, array.array, every numpy bit generator,
    random.Random and the global random states: restored and verified there with their
    values, native byte order (unless the program chose one) and identity; captured there
    and restored and verified here."""
    shutil.copy(PROGRAM, tmp_path / PROGRAM.name)
    repo = str(tmp_path / "repo")
    cap = _host_run_capture(tmp_path, repo)
    there = _foreign(machine, [PROGRAM.name, "check", repo, cap, "again"], tmp_path)
    assert there["machine"] != "x86_64" and there["failures"] == [], there
    assert there["verify"] == [True, None], there
    back = _host([PROGRAM.name, "check", repo, there["capsule"]], tmp_path)
    assert back["failures"] == [] and back["verify"] == [True, None], back


def _host_run_capture(tmp_path: Path, repo: str) -> str:
    p = subprocess.run([sys.executable, PROGRAM.name, "capture", repo], cwd=tmp_path, capture_output=True,
                       text=True, timeout=600, env=_host_env())
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


SCRIPT = KILL_PRELUDE + '''
import random
import numpy as np

rng = np.random.default_rng(2026)
mt = np.random.RandomState(9)
np.random.seed(1)
random.seed(2)
weights = np.linspace(0.0, 1.0, 8).astype(np.float32)
counts = np.zeros(4, dtype=np.int64)
history = []
window = weights[2:6]                       # a view: must stay one with weights
for step in range(6):
    kill_here(step)
    noise = rng.normal(size=8).astype(np.float32) * np.float32(0.1)
    weights += noise
    counts[mt.randint(0, 4)] += 1
    history.append((step, float(weights.sum()), float(np.random.random()), random.random()))
    print(step, repr(float(window.sum())), counts.tolist(), repr(history[-1][2]), repr(history[-1][3]),
          flush=True)
window *= np.float32(2)
print("done", repr(float(weights.sum())), np.shares_memory(window, weights))
'''


def test_paused_script_moves_there_and_back(machine: Foreign, tmp_path: Path) -> None:
    """`sojourn run` here pauses at step 2, `sojourn resume` there carries the workspace on
    and pauses again at step 4, `sojourn resume` here finishes it: the output is the output
    of a run that never paused."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    repo = str(tmp_path / "repo")
    env = _host_env()
    plain = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                           timeout=300, env=env)
    assert plain.returncode == 0, plain.stderr

    cli = ["-m", "sojourn.cli.main"]
    env["KILLS"] = "2,4"  # the script's own SIGTERMs; the set travels with it
    first = subprocess.run([sys.executable, *cli, "run", "--repo", repo, str(script)], cwd=tmp_path,
                           capture_output=True, text=True, timeout=300, env=env)
    assert first.returncode == EXIT_PAUSED, first.stderr
    ws = re.search(r"workspace (ws_[0-9a-z]+)", first.stderr)
    assert ws, first.stderr

    second = machine.run(["python3", *cli, "resume", "--repo", repo, "--python", "/usr/bin/python3", ws.group(1)],
                         cwd=tmp_path, binds=_binds(tmp_path))
    assert second.returncode == EXIT_PAUSED, f"on {machine.arch}:\n{second.stdout}\n{second.stderr}"

    third = subprocess.run([sys.executable, *cli, "resume", "--repo", repo, "--python", sys.executable, ws.group(1)],
                           cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert third.returncode == 0, third.stderr
    assert first.stdout + second.stdout + third.stdout == plain.stdout
    assert all(seg.stdout for seg in (first, second, third))  # each machine ran steps


def _restore_there(machine: Foreign, tmp_path: Path, repo: str, cap: str) -> str:
    code = ("import sojourn, sys\n"
            "try:\n"
            f"    sojourn.restore({cap!r}, {repo!r})\n"
            "    print('restored')\n"
            "except Exception as e:\n"
            "    print(type(e).__name__, e)\n")
    (tmp_path / "restore_there.py").write_text(code)
    p = machine.run(["python3", "restore_there.py"], cwd=tmp_path, binds=_binds(tmp_path))
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


def test_long_double_values_are_refused_where_they_mean_other_numbers(machine: Foreign, tmp_path: Path) -> None:
    """x86_64's float128 is 80-bit extended precision; arm64's and s390x's is IEEE quad: the
    same bytes are other numbers there, which the fingerprints (over bytes) cannot see."""
    import sojourn
    from sojourn.capsule.reducers.numpy_order import longdouble_format

    if longdouble_format() != "63/15/16":
        pytest.skip("this machine's long double is not x86's extended precision")
    repo = str(tmp_path / "repo")
    cap = sojourn.capture({"acc": np.array([1.5, 1e-4000], dtype=np.longdouble)}, repo).id
    out = _restore_there(machine, tmp_path, repo, cap)
    assert out.startswith("RestoreError") and "80-bit extended precision" in out and "quadruple" in out, out
    cap = sojourn.capture({"one": np.longdouble(1) / 3}, repo).id
    out = _restore_there(machine, tmp_path, repo, cap)
    assert out.startswith("RestoreError") and "'one'" in out and "float64" in out, out


def test_torch_tensors_are_refused_clearly_on_a_big_endian_machine(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    import sojourn

    machine = foreign("s390x")
    repo = str(tmp_path / "repo")
    cap = sojourn.capture({"w": torch.arange(4.0)}, repo).id
    out = _restore_there(machine, tmp_path, repo, cap)
    assert out.startswith("IntegrityError") and "torch tensors" in out and "little-endian machine" in out, out
