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


def test_verify_checks_a_paused_programs_capsule_as_its_write_check_does(tmp_path: Path) -> None:
    from tests.workspace.conftest import Shell

    sh = Shell(tmp_path)
    sh.write("prog.py", """
        import dataclasses
        SCALE = 3
        @dataclasses.dataclass
        class Point:
            x: int = SCALE
            def scaled(self, k=SCALE):
                return self.x * k
        def step(p, i):
            return p.scaled() + i
        p = Point()
        for i in range(4):
            kill_here(i)
            print(step(p, i), flush=True)
    """)
    run = sh.cli("run", "prog.py", env={"KILLS": "2"})
    assert run.returncode == 75, run.stderr
    cap = sh.show(sh.show_id(run.stderr))["capsules"][-1]["id"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    ok = sojourn_cmd("verify", cap, "--repo", sh.repo, cwd=elsewhere)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert f"{cap}: OK" in ok.stdout and "fingerprints matched" in ok.stdout
    report = json.loads(sojourn_cmd("verify", cap, "--repo", sh.repo, "--json", cwd=elsewhere).stdout)
    assert report["ok"] and {v["name"] for v in report["variables"]} >= {"Point", "step", "p"}
    # What the write check would refuse, verify refuses, with the check's reason (an edit of
    # code the paused program has run).
    prog = sh.dir / "prog.py"
    prog.write_text(prog.read_text().replace("p = Point()", "p = Point(5)"))
    bad = sojourn_cmd("verify", cap, "--repo", sh.repo, cwd=elsewhere)
    assert bad.returncode == 1 and "FAILED" in bad.stderr and "prog.py" in bad.stderr, bad.stderr


def test_an_accepted_edit_is_recorded_in_the_workspace_and_source_gives_back_the_captured_file(tmp_path: Path) -> None:
    from tests.workspace.conftest import Shell

    sh = Shell(tmp_path)
    prog = sh.write("prog.py", """
        def report(total):
            return f"total {total}"
        total = 0
        for i in range(4):
            kill_here(i)
            total += i
        print(report(total))
    """)
    captured = prog.read_text()
    run = sh.cli("run", "prog.py", env={"KILLS": "2"})
    assert run.returncode == 75, run.stderr
    ws = sh.show_id(run.stderr)
    cap = sh.show(ws)["capsules"][-1]["id"]
    prog.write_text(captured.replace('f"total {total}"', 'f"TOTAL = {total}"'))
    again = sh.cli("resume", ws)
    assert again.returncode == 0, again.stderr
    assert again.stdout == "TOTAL = 6\n"
    assert '+    return f"TOTAL = {total}"' in again.stderr
    edited = [e for e in sh.show(ws)["events"] if e["type"] == "edited"]
    assert len(edited) == 1 and edited[0]["capsule"] == cap
    assert edited[0]["files"][0]["path"] == "prog.py" and '-    return f"total {total}"' in edited[0]["files"][0]["diff"]
    assert f"resumed {cap} with sources edited since: prog.py (+1 -1)" in sh.cli("show", ws).stdout
    # The source as captured: printed, one file alone, or written under a directory.
    listing = sojourn_cmd("source", cap, "--repo", sh.repo, cwd=tmp_path)
    assert listing.returncode == 0 and "# ==> prog.py (__main__, edited since the capture) <==" in listing.stdout
    one = sojourn_cmd("source", cap, "prog.py", "--repo", sh.repo, cwd=tmp_path)
    assert one.returncode == 0 and one.stdout == captured
    out = sojourn_cmd("source", cap, "--repo", sh.repo, "--to", str(tmp_path / "recovered"), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "recovered" / "prog.py").read_text() == captured
    missing = sojourn_cmd("source", cap, "other.py", "--repo", sh.repo, cwd=tmp_path)
    assert missing.returncode != 0 and "holds no source 'other.py'; it holds prog.py" in missing.stderr
