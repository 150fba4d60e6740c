"""`sojourn inspect` and `sojourn verify`, run as real commands."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import sojourn
from tests.conftest import SRC


def sojourn_cmd(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(SRC), COLUMNS="200")
    return subprocess.run(
        [sys.executable, "-m", "sojourn.cli.main", *args], capture_output=True, text=True, cwd=cwd, env=env
    )


def test_inspect_shows_variables_environment_and_json(repo: str, tmp_path: Path) -> None:
    import numpy as np

    ref = sojourn.capture({"weights": np.ones((10, 10)), "name": "run-1"}, repo, labels={"epoch": 3})
    out = sojourn_cmd("inspect", ref.id, "--repo", repo, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert ref.id in out.stdout and "weights" in out.stdout and "numpy.ndarray" in out.stdout
    assert "python" in out.stdout and "numpy" in out.stdout
    data = json.loads(sojourn_cmd("inspect", ref.id[:12], "--repo", repo, "--json", cwd=tmp_path).stdout)
    assert data["id"] == ref.id
    assert {v["name"] for v in data["variables"]} == {"weights", "name"}
    assert data["labels"] == {"epoch": 3}
    assert data["distributions"].get("numpy") == np.__version__


def test_verify_ok_and_failure(repo: str, tmp_path: Path) -> None:
    ref = sojourn.capture({"x": list(range(10))}, repo)
    ok = sojourn_cmd("verify", ref.id, "--repo", repo, cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert "OK" in ok.stdout and "fingerprints matched" in ok.stdout
    # Corrupt the manifest: verify must fail with a clear message and a non-zero exit.
    manifest = Path(repo) / "capsules" / f"{ref.id}.json"
    manifest.write_text(manifest.read_text().replace('"x"', '"y"'))
    bad = sojourn_cmd("verify", ref.id, "--repo", repo, cwd=tmp_path)
    assert bad.returncode != 0
    assert "signature" in (bad.stderr + bad.stdout)


def test_errors_are_one_clear_line(tmp_path: Path) -> None:
    out = sojourn_cmd("inspect", "cap_0123", "--repo", str(tmp_path / "nowhere"), cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.startswith("sojourn: error: no sojourn repository at")
    assert "Traceback" not in out.stderr
