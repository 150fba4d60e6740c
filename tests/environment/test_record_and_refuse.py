"""A capsule records the distributions its objects come from (per variable, with origin,
requirements and build variant), and a restore where one is missing is refused by name
before anything is unpickled: through the API, `sojourn verify`, and for a bad --python."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SRC, last_json, run_py
from tests.environment.conftest import with_path

CAPTURE = """
import json, sys
import envdemo, six

class Loud:
    # Unpickling this runs print(): if the restore unpickled anything, it would show.
    def __reduce__(self):
        return (print, ("UNPICKLED",))

import sojourn
ns = {"first": Loud(), "plain": [1, 2], "obj": envdemo.Thing(5), "again": {"t": envdemo.Thing(6)}}
m = sojourn.capture(ns, repo=sys.argv[1])
print(json.dumps({"cap": m.id}))
"""

READ_MANIFEST = """
import json, sys
from sojourn.capsule import format as fmt
from sojourn.repository.repo import open_repository
with open_repository(sys.argv[1]) as r:
    m = fmt.load_manifest(r, sys.argv[2])
print(json.dumps({"needs": m.needs, "packages": m.packages, "raw": r.backend.load("capsules", m.id + ".json").decode()}))
"""

RESTORE = """
import json, sys
from sojourn.capsule.restore import restore_capsule
from sojourn.repository.repo import open_repository
try:
    with open_repository(sys.argv[1]) as r:
        # check=False: ``first`` comes back as print()'s None, which its fingerprint refuses
        ns = restore_capsule(r, sys.argv[2], check=False)
    print(json.dumps({"ok": True, "n": ns["obj"].n}))
except Exception as e:
    print(json.dumps({"ok": False, "type": type(e).__name__, "error": str(e),
                      "module_not_found": isinstance(e, ModuleNotFoundError),
                      "imported": "envdemo" in sys.modules}))
"""


@pytest.fixture
def work(tmp_path: Path) -> Path:
    # The programs run here: the site directory is outside (a module under the working
    # directory is a workspace module, which travels as source).
    d = tmp_path / "work"
    d.mkdir()
    return d


@pytest.fixture
def captured(work: Path, repo: str, site: Path) -> str:
    out = last_json(run_py(CAPTURE, repo, cwd=work, env=with_path(site)))
    return str(out["cap"])  # type: ignore[index]


def test_needs_and_packages_are_recorded(work: Path, repo: str, captured: str) -> None:
    m = last_json(run_py(READ_MANIFEST, repo, captured, cwd=work))
    needs, packages = m["needs"], m["packages"]  # type: ignore[index]
    assert needs["envdemo"] == {"distribution": "envdemo", "version": "1.2.3", "variables": ["obj", "again"]}
    assert "six" not in needs  # imported, but no captured object comes from it
    demo = packages["envdemo"]
    assert demo["version"] == "1.2.3" and demo["requires"] == ["six"]  # the extra's pytest is not
    assert demo["source"]["kind"] == "editable" and demo["source"]["url"].endswith("/checkout")
    import importlib.metadata as md

    assert packages["six"]["version"] == md.version("six") and packages["six"]["source"]["kind"] == "index"
    assert set(packages) == {"envdemo", "six"}


def test_a_capsule_of_plain_values_records_no_environment(work: Path, repo: str) -> None:
    cap = last_json(run_py("import json, sys, sojourn\nprint(json.dumps({'cap': sojourn.capture({'a': [1, 'x']}, "
                           "repo=sys.argv[1]).id}))", repo, cwd=work))["cap"]  # type: ignore[index]
    m = last_json(run_py(READ_MANIFEST, repo, cap, cwd=work))
    doc = json.loads(m["raw"])  # type: ignore[index]
    assert "needs" not in doc and "packages" not in doc  # the manifest (and its id) as before


def test_restore_without_the_library_is_refused_before_unpickling(work: Path, repo: str, site: Path, captured: str) -> None:
    bare = run_py(RESTORE, repo, captured, cwd=work)
    r = last_json(bare)
    assert r["ok"] is False and r["type"] == "MissingLibraryError" and r["module_not_found"], r  # type: ignore[index]
    err = r["error"]  # type: ignore[index]
    assert "\n" not in err
    for word in ("envdemo 1.2.3", "'obj', 'again'", "nothing was unpickled", "uv pip install", "'envdemo==1.2.3'",
                 "--build-env"):
        assert word in err, (word, err)
    assert "UNPICKLED" not in bare.stdout and not r["imported"]  # type: ignore[index]
    # With the library on the path, the same restore goes through (and does unpickle).
    ok = run_py(RESTORE, repo, captured, cwd=work, env=with_path(site))
    assert last_json(ok) == {"ok": True, "n": 5} and "UNPICKLED" in ok.stdout


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    import os

    env = dict(os.environ, PYTHONPATH=str(SRC))
    return subprocess.run([sys.executable, "-m", "sojourn.cli.main", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def test_verify_says_what_is_missing_in_one_line(work: Path, repo: str, captured: str) -> None:
    v = _cli("verify", captured, "--repo", repo, cwd=work)
    assert v.returncode == 1
    [line] = v.stderr.strip().splitlines()
    assert "FAILED: capsule" in line and "needs envdemo 1.2.3" in line and "--build-env" in line, v.stderr
    # `sojourn env` shows the same against this interpreter, without building anything.
    e = _cli("env", captured, "--repo", repo, "--json", cwd=work)
    plan = json.loads(e.stdout)
    assert plan["missing"] == ["envdemo"] and plan["supported"] and "envdemo==1.2.3" in plan["requirements"]


def _pyenv(version: str) -> str:
    import glob

    found = sorted(glob.glob(str(Path.home() / f".pyenv/versions/{version}.*/bin/python{version}")))
    if not found:
        pytest.skip(f"no bare Python {version} (pyenv) on this machine")
    return found[-1]


def test_an_unsupported_or_bare_interpreter_is_named(work: Path, repo: str, captured: str) -> None:
    old = _cli("verify", captured, "--repo", repo, "--python", _pyenv("3.10"), cwd=work)
    assert old.returncode != 0 and "sojourn needs CPython 3.11 or newer" in old.stderr, old.stderr
    assert "Traceback" not in old.stderr
    cap = last_json(run_py("import json, sys, sojourn\nprint(json.dumps({'cap': sojourn.capture({'a': 1}, "
                           "repo=sys.argv[1]).id}))", repo, cwd=work))["cap"]  # type: ignore[index]
    bare = _cli("verify", str(cap), "--repo", repo, "--python", _pyenv("3.12"), cwd=work)
    assert bare.returncode != 0 and "lacks sojourn's own modules blake3" in bare.stderr, bare.stderr
    assert "--build-env" in bare.stderr and "Traceback" not in bare.stderr


PAUSED = """
import envdemo
t = envdemo.Thing(1)
for i in range(3):
    t = envdemo.Thing(t.n + 1)
    print(i, t.n, flush=True)
    kill_here(i)
"""


def test_a_resume_where_the_library_is_gone_says_so_in_one_line(tmp_path: Path, site: Path) -> None:
    """The program ran with envdemo; its session resumes where envdemo is not installed (the
    same interpreter, no --python): the session itself refuses before the program's imports
    run again, in one line, and the workspace stays resumable."""
    from tests.environment.conftest import with_path
    from tests.workspace.conftest import Shell

    sh = Shell(tmp_path)
    try:
        sh.write("uses_lib.py", PAUSED)
        lib = with_path(site)
        run = sh.cli("run", "--name", "lib", "uses_lib.py", env={"KILLS": "0", **lib})
        assert run.returncode == 75 and run.stdout == "0 2\n", run.stderr
        gone = sh.cli("resume", "lib")
        assert gone.returncode != 0 and gone.stdout == ""
        assert "Traceback" not in gone.stderr, gone.stderr
        line = next(ln for ln in gone.stderr.splitlines() if "needs envdemo 1.2.3" in ln)
        assert not [ln for ln in gone.stderr.splitlines() if "MissingLibraryError" in ln], gone.stderr
        assert "'t'" in line and "nothing was unpickled" in line and "--build-env" in line
        assert sh.show("lib")["next_action"]["action"] == "resume"
        back = sh.cli("resume", "lib", env=lib)  # with the library again, it carries on
        assert back.returncode == 0 and back.stdout == "1 3\n2 4\n", back.stderr
    finally:
        sh.kill_all()


def test_a_library_on_a_plain_path_directory_is_still_a_library(work: Path, repo: str, site: Path,
                                                                 tmp_path: Path) -> None:
    """The same distribution installed into a site directory on one machine and into a plain
    PYTHONPATH directory on another (``pip install --target``, a cluster's shared software):
    its objects are pickled by reference on both, so the fingerprints agree both ways."""
    import shutil

    plain = tmp_path / "target-dir"
    shutil.copytree(site, plain)
    here_site = with_path(site)
    there_plain = {"PYTHONPATH": f"{SRC}:{plain}"}
    code = """
import json, sys
import envdemo
import sojourn
if sys.argv[2] == "capture":
    print(json.dumps({"cap": sojourn.capture({"t": envdemo.Thing(4)}, repo=sys.argv[1]).id}))
else:
    ns = sojourn.restore(sys.argv[2], repo=sys.argv[1])
    print(json.dumps({"n": ns["t"].n, "from": envdemo.__file__}))
"""
    for writer, reader in ((here_site, there_plain), (there_plain, here_site)):
        cap = last_json(run_py(code, repo, "capture", cwd=work, env=writer))["cap"]  # type: ignore[index]
        got = last_json(run_py(code, repo, cap, cwd=work, env=reader))
        assert got["n"] == 4, got  # type: ignore[index]
    assert str(plain) in got["from"] or str(site) in got["from"]  # type: ignore[index]
