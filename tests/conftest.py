"""Shared fixtures: repositories, and running code in a fresh interpreter.

Restore tests always restore in another process: a round trip inside the capturing process
would hide exactly the bugs a capsule exists to prevent (string hashing, interning,
modules that are already imported, classes that already exist).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"


# Prepended to test scripts: ``kill_here(tag)`` sends the process a real signal at the points
# named by the ``KILLS`` environment variable (each once).
KILL_PRELUDE = """\
import os as _os, signal as _signal
_KILLS = _os.environ.get("KILLS", "")
_KILLS = set(_KILLS.split(",")) if _KILLS else set()
_SEEN = set()
def kill_here(tag, sig=_signal.SIGTERM):
    tag = str(tag)
    if tag in _KILLS and tag not in _SEEN:
        _SEEN.add(tag)
        _os.kill(_os.getpid(), sig)
"""


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keys and the default repository live in a per-test SOJOURN_HOME."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("SOJOURN_HOME", str(home))
    monkeypatch.delenv("SOJOURN_REPO", raising=False)
    monkeypatch.delenv("SOJOURN_KEY", raising=False)
    # A supervisor inside a Slurm job or a pod would take SIGUSR1/SIGTERM as a preemption
    # notice; tests that want notices set this themselves.
    monkeypatch.setenv("SOJOURN_NOTICES", "none")


@pytest.fixture
def repo(tmp_path: Path) -> str:
    return str(tmp_path / "repo")


def run_py(
    code: str,
    *args: str,
    cwd: str | os.PathLike[str] | None = None,
    python: str | None = None,
    env: dict[str, str] | None = None,
    check: bool = True,
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` as a script in a fresh interpreter (``python`` or this one)."""
    cwd = Path(cwd) if cwd is not None else Path.cwd()
    script = cwd / f"_script_{abs(hash(code)) % 10**8}.py"
    script.write_text(textwrap.dedent(code))
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = str(SRC) + (os.pathsep + full_env["PYTHONPATH"] if full_env.get("PYTHONPATH") else "")
    full_env.update(env or {})
    proc = subprocess.run(
        [python or sys.executable, str(script), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"script failed with exit code {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
        )
    return proc


def last_json(proc: subprocess.CompletedProcess[str]) -> object:
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(("{", "["))]
    assert lines, proc.stdout + proc.stderr
    return json.loads(lines[-1])


def interpreters() -> dict[str, str]:
    """Python interpreters with sojourn and numpy importable, by minor version."""
    found: dict[str, str] = {}
    for v in ("3.11", "3.12", "3.13"):
        cand = ROOT / f".venv{v}" / "bin" / "python"
        if cand.exists():
            found[v] = str(cand)
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    found.setdefault(here, sys.executable)
    return found


def needs_python(version: str) -> str:
    py = interpreters().get(version)
    if py is None:
        pytest.skip(f"Python {version} with sojourn and numpy is not available (make crossvenvs creates .venv{version})")
    return py


# Parts of the suite that start daemons (radosgw, Slurm, sshd), Jupyter kernels, many fresh
# interpreters or foreign-architecture emulators. `make unit` leaves them out (-m "not slow")
# so that the inner loop stays a few minutes; `make test` and CI run everything. A test
# elsewhere that takes more than ~10 s carries @pytest.mark.slow itself.
SLOW_PARTS = (
    "corpus/",
    "crossarch/",
    "conformance/",
    "console/test_browser.py",  # Chromium and real moves
    "notebook/",
    "providers/test_slurm.py",
    "providers/test_ssh.py",
    "repository/test_s3.py",
    "repository/test_store_faults.py",
    "workspace/test_campaign.py",
    "workspace/test_store_campaign.py",
    "workspace/test_tampering_authority.py",
    "workspace/test_faults.py",
    "workspace/test_faults_orphan.py",
    # torch training, OOM and autograd sessions, notices and live moves: 10-35 s each
    "capsule/test_torch.py",
    "execution/test_autograd.py",
    "execution/test_oom.py",
    "execution/test_training.py",
    "notices/test_preemption.py",
    "router/test_policy_integration.py",
    "workspace/test_machines.py",
    "workspace/test_move.py",
    "workspace/test_oom_policy.py",
    "workspace/test_resource_limits.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tests_dir = ROOT / "tests"
    for item in items:
        try:
            rel = item.path.relative_to(tests_dir).as_posix()
        except ValueError:
            continue
        if rel.startswith(SLOW_PARTS):
            item.add_marker(pytest.mark.slow)
