"""Python 3.14 and 3.15 as other machines sharing the repository: a Debian unstable root
(amd64, native, no qemu) with python3.14 and python3.15, where sojourn runs from this tree
with its dependencies as wheels for that Python, and without ``zstandard`` (no wheel for
3.15; 3.14+ has ``compression.zstd``). Capsules and paused programs go from this
interpreter to each of them and back.

The root is built once per machine (about 2 minutes, needs root and Debian's mirror):

    SUITE=unstable tools/foreign-rootfs amd64 "" python3.15 python3.15-venv

and the tests skip, saying so, where it is absent.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from tests.conftest import ROOT, last_json, run_py
from tests.crossarch.foreign import BUILD_TIMEOUT, Foreign, _building, cache_dir

ROOT_NAME = "amd64-unstable"
BUILD_LINE = 'SUITE=unstable tools/foreign-rootfs amd64 "" python3.15 python3.15-venv'
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]

pytestmark = pytest.mark.slow


def _root() -> Path:
    """The built root: used, waited for while a build runs (CI starts one in the background),
    built when ``SOJOURN_REQUIRE_NEWPYTHONS=1``, or the test skips saying how to build it."""
    root = cache_dir() / ROOT_NAME
    if shutil.which("unshare") is None:
        pytest.skip("unshare is not installed")
    if (root / ".sojourn-rootfs-ok").exists():
        return root
    required = os.environ.get("SOJOURN_REQUIRE_NEWPYTHONS") == "1"
    if not required and not _building(root.with_name(root.name + ".lock")):
        pytest.skip(f"no Debian unstable root in {root}: build it once with `{BUILD_LINE}` (about 2 min), or set "
                    "SOJOURN_REQUIRE_NEWPYTHONS=1 to let the tests build it")
    with open(root.with_name(root.name + ".log"), "a") as log:  # waits on the build's lock, or builds
        proc = subprocess.run(["tools/foreign-rootfs", "amd64", str(root), "python3.15", "python3.15-venv"],
                              cwd=ROOT, env=dict(os.environ, SUITE="unstable"), stdout=log,
                              stderr=subprocess.STDOUT, timeout=BUILD_TIMEOUT)
    if proc.returncode != 0 or not (root / ".sojourn-rootfs-ok").exists():
        pytest.fail(f"building the Debian unstable root failed: see {root.name}.log in {root.parent}")
    return root


def _deps(root: Path, version: str) -> str:
    """blake3, click, rich (this interpreter's versions) and numpy for Python ``version``,
    installed once into the root; no zstandard (sojourn uses compression.zstd there)."""
    pins = [f"{n}=={metadata.version(n)}" for n in ("blake3", "click", "rich")] + ["numpy"]
    # Debian's site directory for /usr/local: a library location, as pip would install there
    # (on a plain PYTHONPATH directory numpy's modules would count as workspace modules).
    inside = f"/usr/local/lib/python{version}/dist-packages"
    target = root / inside.lstrip("/")
    if (target / ".ok").exists():
        return inside
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".lock{version}", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / ".ok").exists():
            return inside
        partial = target.with_name(target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile",
               "--target", str(partial), "--only-binary=:all:", "--implementation", "cp",
               "--python-version", version, "--abi", "cp" + version.replace(".", ""),
               *[a for p in PLATFORMS for a in ("--platform", p)], *pins]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            pytest.skip(f"no wheels of sojourn's dependencies for Python {version}: {proc.stderr[-1500:]}")
        shutil.rmtree(target, ignore_errors=True)
        partial.rename(target)
        (target / ".ok").write_text(" ".join(pins))
    return inside


def _python(version: str) -> tuple[Foreign, str]:
    root = _root()
    if not (root / "usr" / "bin" / f"python{version}").exists():
        pytest.skip(f"the unstable root has no python{version}")
    return Foreign("amd64", root, _deps(root, version)), f"/usr/bin/python{version}"


CAPTURE = """
import json, sys
import numpy as np
import sojourn
from sojourn.repository import zstd

def scale(v, k=3):
    return [x * k for x in v]

g = np.random.default_rng(7); g.random(2)
ns = {"a": np.arange(12.0).reshape(3, 4), "g": g, "f": scale, "text": "same words " * 40000,
      "d": {"k": (1, 2.5, None), "s": {3, 4}}}
m = sojourn.capture(ns, repo=sys.argv[1])
print(json.dumps({"cap": m.id, "zstd": zstd.IMPLEMENTATION, "python": sys.version.split()[0]}))
"""

RESTORE = """
import json, sys
import numpy as np
import sojourn
from sojourn.repository import zstd
ns = sojourn.restore(sys.argv[2], repo=sys.argv[1])
print(json.dumps({"a": ns["a"].sum().item(), "g": ns["g"].random(), "f": ns["f"]([1, 2]), "text": len(ns["text"]),
                  "d": [list(ns["d"]["k"]), sorted(ns["d"]["s"])], "zstd": zstd.IMPLEMENTATION,
                  "python": sys.version.split()[0], "zstandard": "zstandard" in sys.modules}))
"""


def _inside(f: Foreign, python: str, code: str, *args: str, cwd: Path) -> dict[str, object]:
    script = cwd / f"_inside_{abs(hash(code)) % 10**8}.py"
    script.write_text(code)
    p = f.run([python, str(script), *args], cwd=cwd, binds=[cwd, Path(os.environ["SOJOURN_HOME"])])
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads([ln for ln in p.stdout.splitlines() if ln.startswith("{")][-1])  # type: ignore[no-any-return]


@pytest.mark.parametrize("version", ["3.14", "3.15"])
def test_capsules_go_to_a_new_python_and_back(tmp_path: Path, version: str) -> None:
    f, python = _python(version)
    repo = str(tmp_path / "repo")
    mine = last_json(run_py(CAPTURE, repo, cwd=tmp_path))
    there = _inside(f, python, RESTORE, repo, mine["cap"], cwd=tmp_path)  # type: ignore[index]
    here_again = last_json(run_py(RESTORE, repo, mine["cap"], cwd=tmp_path))  # type: ignore[index]
    assert there["python"].startswith(version) and there["zstd"] == "stdlib" and not there["zstandard"]  # type: ignore[union-attr]
    for k in ("a", "g", "f", "text", "d"):
        assert there[k] == here_again[k], k  # type: ignore[index]
    # ... and back: captured there (compression.zstd), restored here (zstandard).
    theirs = _inside(f, python, CAPTURE, repo, cwd=tmp_path)
    assert theirs["zstd"] == "stdlib"
    back = last_json(run_py(RESTORE, repo, theirs["cap"], cwd=tmp_path))  # type: ignore[index]
    assert back["zstd"] == "zstandard" and back["text"] == len("same words " * 40000)  # type: ignore[index]
    assert back["a"] == 66.0 and back["f"] == [3, 6]  # type: ignore[index]


PROGRAM = """
import numpy as np
acc = np.zeros(3)
def step(i):
    return np.full(3, float(i))
for i in range(5):
    acc = acc + step(i)
    print(i, acc.tolist(), flush=True)
    kill_here(i)
print("done", acc.sum())
"""


@pytest.mark.parametrize("version", ["3.14", "3.15"])
def test_a_paused_program_moves_from_a_new_python_to_this_one(tmp_path: Path, version: str) -> None:
    """`sojourn run` there pauses (exit 75); `sojourn resume` here carries it on."""
    from tests.conftest import KILL_PRELUDE
    from tests.workspace.conftest import Shell

    f, python = _python(version)
    sh = Shell(tmp_path)
    try:
        (sh.dir / "prog.py").write_text(KILL_PRELUDE + PROGRAM)
        home = Path(os.environ["SOJOURN_HOME"])  # the repository's key: the same on both "machines"
        p = f.run([python, "-m", "sojourn.cli.main", "run", "--name", "p", "prog.py"], cwd=sh.dir,
                  binds=[tmp_path, home], env={"SOJOURN_REPO": sh.repo, "KILLS": "1", "SOJOURN_NOTICES": "none"})
        assert p.returncode == 75, p.stdout + p.stderr
        assert p.stdout == "0 [0.0, 0.0, 0.0]\n1 [1.0, 1.0, 1.0]\n"
        res = sh.cli("resume", "p")
        assert res.returncode == 0, res.stderr
        assert res.stdout == "2 [3.0, 3.0, 3.0]\n3 [6.0, 6.0, 6.0]\n4 [10.0, 10.0, 10.0]\ndone 30.0\n"
        a, b = sh.show("p")["allocations"]
        assert a["python_version"].startswith(version) and b["python_version"] == sys.version.split()[0]
    finally:
        sh.kill_all()


@pytest.mark.parametrize("version", ["3.14", "3.15"])
def test_a_paused_program_moves_from_this_python_to_a_new_one(tmp_path: Path, version: str) -> None:
    """`sojourn run` here pauses; `sojourn resume` there (another Python, numpy 2.4 -> 2.5,
    no zstandard) carries it on."""
    from tests.conftest import KILL_PRELUDE
    from tests.workspace.conftest import Shell

    f, python = _python(version)
    sh = Shell(tmp_path)
    try:
        (sh.dir / "prog.py").write_text(KILL_PRELUDE + PROGRAM)
        run = sh.cli("run", "--name", "p", "prog.py", env={"KILLS": "2"})
        assert run.returncode == 75, run.stderr
        home = Path(os.environ["SOJOURN_HOME"])
        p = f.run([python, "-m", "sojourn.cli.main", "resume", "p"], cwd=sh.dir, binds=[tmp_path, home],
                  env={"SOJOURN_REPO": sh.repo, "SOJOURN_NOTICES": "none"})
        assert p.returncode == 0, p.stdout + p.stderr
        assert p.stdout == "3 [6.0, 6.0, 6.0]\n4 [10.0, 10.0, 10.0]\ndone 30.0\n"
        a, b = sh.show("p")["allocations"]
        assert a["python_version"] == sys.version.split()[0] and b["python_version"].startswith(version)
    finally:
        sh.kill_all()
