"""A library version change that keeps values passes: numpy's generators, RandomState and
arrays captured with one numpy restore, every fingerprint equal, under another numpy on
another Python (here 2.4 on 3.11 ↔ 2.5 on 3.12/3.13), both ways; `sojourn env` names the
difference, and the restore does not refuse it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SRC, interpreters, last_json, run_py

CAPTURE = """
import json, sys
import numpy as np
import sojourn
g = np.random.default_rng(0); g.random(3)
ns = {"g": g, "rs": np.random.RandomState(1), "bg": np.random.PCG64(5), "a": np.arange(6.0).reshape(2, 3)}
print(json.dumps({"cap": sojourn.capture(ns, repo=sys.argv[1]).id, "numpy": np.__version__}))
"""


def _numpy(python: str) -> str:
    return subprocess.run([python, "-c", "import numpy; print(numpy.__version__)"], capture_output=True,
                          text=True).stdout.strip()


def _pair() -> tuple[str, str]:
    here = sys.executable
    mine = _numpy(here)
    for _v, py in sorted(interpreters().items()):
        if py != here and _numpy(py) and _numpy(py) != mine:
            return here, py
    pytest.skip("no interpreter with another numpy version (make crossvenvs)")


@pytest.mark.parametrize("direction", ["here-to-there", "there-to-here"])
def test_numpy_values_cross_numpy_versions(tmp_path: Path, repo: str, direction: str) -> None:
    here, there = _pair()
    writer, reader = (here, there) if direction == "here-to-there" else (there, here)
    w = last_json(run_py(CAPTURE, repo, cwd=tmp_path, python=writer))
    env = dict(os.environ, PYTHONPATH=str(SRC))
    cli = [sys.executable, "-m", "sojourn.cli.main"]
    plan = json.loads(subprocess.run([*cli, "env", w["cap"], "--repo", repo, "--python", reader, "--json"],  # type: ignore[index]
                                     env=env, capture_output=True, text=True, check=True).stdout)
    assert plan["missing"] == [] and any(d.startswith("numpy ") for d in plan["differences"]), plan
    v = subprocess.run([*cli, "verify", w["cap"], "--repo", repo, "--python", reader, "--json"],  # type: ignore[index]
                       env=env, capture_output=True, text=True)
    report = json.loads(v.stdout)
    assert report["ok"], report
    assert {x["name"] for x in report["variables"]} >= {"g", "rs", "bg", "a"}
