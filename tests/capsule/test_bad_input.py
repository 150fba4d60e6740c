"""Bad input is refused with a clear error, and before anything is unpickled.

The capsule under test holds a "trap": an object whose reconstructor writes a marker file
when it runs. An intact capsule sets it off (the control test); every damaged one must be
refused with the exact error type and a clear message while the marker stays absent.
Restores run in a fresh interpreter, as always.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sojourn.capsule import format as fmt
from sojourn.repository.local import LocalBackend
from sojourn.repository.repo import open_repository
from tests.conftest import SRC, last_json, run_py

TRAP_MODULE = '''
"""An object whose reconstructor leaves a mark: proof that the capsule was unpickled."""
from pathlib import Path


def arm(marker):
    Path(marker).write_text("unpickled")
    return Trap(marker)


class Trap:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (arm, (self.marker,))
'''

CAPTURE = """
import sys, json
import numpy as np
import sojourn
from trap import Trap
ns = {
    "trap": Trap(sys.argv[2]),
    "data": np.random.default_rng(0).random(100_000),  # incompressible: a raw chunk
    "note": "hello",
}
ref = sojourn.capture(ns, sys.argv[1])
print(json.dumps({"id": ref.id}))
"""

# Prints what happened as JSON: the exact error type and message, or what came back.
ATTEMPT = """
import sys, json
import sojourn
try:
    ns = sojourn.{call}
    out = {{"ok": True, "names": sorted(ns) if isinstance(ns, dict) else None}}
except BaseException as e:
    out = {{"ok": False, "error": type(e).__name__, "message": str(e)}}
print(json.dumps(out))
"""

RESTORE = ATTEMPT.format(call="restore(sys.argv[2], sys.argv[1])")


@dataclass
class Capsule:
    repo: Path
    id: str
    marker: Path
    cwd: Path

    @property
    def backend(self) -> LocalBackend:
        return LocalBackend(self.repo)

    def manifest_bytes(self) -> bytes:
        return self.backend.load("capsules", self.id + ".json")

    def doc(self) -> dict[str, Any]:
        return dict(json.loads(self.manifest_bytes()))

    def write_doc(self, doc: dict[str, Any], name: str | None = None) -> None:
        self.backend.save("capsules", (name or self.id) + ".json", json.dumps(doc, indent=1).encode())

    def restore(self, capsule: str | None = None, env: dict[str, str] | None = None) -> dict[str, Any]:
        proc = run_py(RESTORE, str(self.repo), capsule or self.id, cwd=self.cwd, env=env)
        out = last_json(proc)
        assert isinstance(out, dict)
        return out


@pytest.fixture
def capsule(tmp_path: Path) -> Capsule:
    work = tmp_path / "work"
    work.mkdir()
    (work / "trap.py").write_text(TRAP_MODULE)
    marker = tmp_path / "UNPICKLED"
    repo = tmp_path / "repo"
    out = last_json(run_py(CAPTURE, str(repo), str(marker), cwd=work))
    assert isinstance(out, dict)
    elsewhere = tmp_path / "restore-here"
    elsewhere.mkdir()
    assert not marker.exists()
    return Capsule(repo, str(out["id"]), marker, elsewhere)


def refused(out: dict[str, Any], error: str, *phrases: str) -> None:
    assert not out["ok"], f"the damaged capsule was restored: {out}"
    assert out["error"] == error, out
    for phrase in phrases:
        assert phrase in out["message"], (phrase, out["message"])


def test_an_intact_capsule_sets_off_the_trap(capsule: Capsule) -> None:
    """The control: the marker really is written when the capsule is unpickled."""
    out = capsule.restore()
    assert out == {"ok": True, "names": ["data", "note", "trap"]}
    assert capsule.marker.read_text() == "unpickled"


# -- the manifest ------------------------------------------------------------------------------


def test_a_tampered_manifest_is_refused(capsule: Capsule) -> None:
    doc = capsule.doc()
    trap = next(v for v in doc["variables"] if v["name"] == "trap")
    trap["type"] = "builtins.dict"
    capsule.write_doc(doc)
    refused(capsule.restore(), "IntegrityError", f"capsule {capsule.id} has a bad signature", "Nothing was unpickled")
    assert not capsule.marker.exists()


def test_a_manifest_with_a_recomputed_id_but_no_key_is_refused(capsule: Capsule) -> None:
    # Someone who can write the repository but has no key points a buffer at other chunks
    # and fixes up the id: the signature still gives it away.
    repo = open_repository(capsule.repo)
    manifest = fmt.load_manifest(repo, capsule.id)
    manifest.buffers[0].record.chunks = manifest.buffers[1].record.chunks
    doc = json.loads(fmt.seal(manifest, b"not the repository key"))
    capsule.write_doc(doc, name=doc["id"])
    refused(capsule.restore(doc["id"]), "IntegrityError", "has a bad signature")
    assert not capsule.marker.exists()


@pytest.mark.parametrize("keep", [0, 0.5, -1], ids=["empty", "half", "all-but-the-last-byte"])
def test_a_truncated_manifest_is_refused(capsule: Capsule, keep: float) -> None:
    raw = capsule.manifest_bytes()
    cut = raw[: int(len(raw) * keep)] if keep >= 0 else raw[:-1]
    capsule.backend.save("capsules", capsule.id + ".json", cut)
    refused(capsule.restore(), "IntegrityError", f"capsule manifest {capsule.id} is truncated or not JSON")
    assert not capsule.marker.exists()


def test_an_unknown_format_version_is_refused(capsule: Capsule) -> None:
    # Correctly signed with the repository's own key: the version alone must stop it.
    repo = open_repository(capsule.repo)
    manifest = fmt.load_manifest(repo, capsule.id)
    manifest.version = fmt.VERSION + 1
    sealed = fmt.seal(manifest, repo.key)
    repo.backend.save("capsules", manifest.id + ".json", sealed)
    refused(
        capsule.restore(manifest.id),
        "IntegrityError",
        f"has format version {fmt.VERSION + 1}",
        f"reads version {fmt.VERSION}",
        "Upgrade sojourn",
    )
    assert not capsule.marker.exists()


def test_the_wrong_key_is_refused(capsule: Capsule) -> None:
    out = capsule.restore(env={"SOJOURN_KEY": "ab" * 32})
    refused(out, "IntegrityError", "bad signature", "written with another repository key", "SOJOURN_KEY")
    assert not capsule.marker.exists()


def test_a_key_that_is_not_hex_is_refused(capsule: Capsule) -> None:
    refused(capsule.restore(env={"SOJOURN_KEY": "not hex"}), "RepositoryError", "SOJOURN_KEY must be the key in hex")
    assert not capsule.marker.exists()


# -- the chunks --------------------------------------------------------------------------------


def _chunk(capsule: Capsule, which: str) -> str:
    doc = capsule.doc()
    if which == "stream":  # zstd-compressed pickle stream: the trap's own bytes
        return str(doc["stream"]["chunks"][0]) + "-z"
    raw = next(b for b in doc["buffers"] if b["codec"] == "raw")
    return str(raw["chunks"][0])


@pytest.mark.parametrize("which", ["stream", "array"])
def test_a_flipped_byte_in_a_chunk_is_refused(capsule: Capsule, which: str) -> None:
    name = _chunk(capsule, which)
    blob = bytearray(capsule.backend.load("chunks", name))
    blob[len(blob) // 3] ^= 0x04
    capsule.backend.save("chunks", name, memoryview(blob))
    refused(capsule.restore(), "IntegrityError", f"chunk {name[:16]}… is corrupt", "Nothing was unpickled")
    assert not capsule.marker.exists()


def test_verify_refuses_a_corrupt_chunk_too(capsule: Capsule) -> None:
    import sojourn

    name = _chunk(capsule, "array")
    blob = bytearray(capsule.backend.load("chunks", name))
    blob[-1] ^= 0x80
    capsule.backend.save("chunks", name, memoryview(blob))
    report = sojourn.verify(capsule.id, str(capsule.repo))
    assert not report.ok
    assert report.error is not None and "is corrupt" in report.error
    assert not capsule.marker.exists()


@pytest.mark.parametrize("which", ["stream", "array"])
def test_a_missing_chunk_is_refused(capsule: Capsule, which: str) -> None:
    name = _chunk(capsule, which)
    capsule.backend.remove("chunks", name)
    refused(capsule.restore(), "IntegrityError", f"chunk {name[:16]}… is missing from the repository", "Nothing was unpickled")
    assert not capsule.marker.exists()


# -- the repository ----------------------------------------------------------------------------


def test_a_repository_path_that_does_not_exist(capsule: Capsule, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir" / "repo"
    out = last_json(run_py(RESTORE, str(missing), capsule.id, cwd=capsule.cwd))
    assert isinstance(out, dict)
    refused(out, "RepositoryNotFound", f"no sojourn repository at {missing}: the location does not exist")
    capture = ATTEMPT.format(call="capture({'x': 1}, sys.argv[1])")
    out = last_json(run_py(capture, str(missing), cwd=capsule.cwd))
    assert isinstance(out, dict)
    refused(out, "RepositoryNotFound", "cannot create a repository at", "parent directory", "does not exist")
    assert not missing.parent.exists()
    assert not capsule.marker.exists()


def test_a_path_that_is_not_a_repository(capsule: Capsule, tmp_path: Path) -> None:
    (tmp_path / "plain").mkdir()
    out = last_json(run_py(RESTORE, str(tmp_path / "plain"), capsule.id, cwd=capsule.cwd))
    assert isinstance(out, dict)
    refused(out, "RepositoryNotFound", "is not a sojourn repository (no config/config.json)")
    (tmp_path / "afile").write_text("x")
    out = last_json(run_py(RESTORE, str(tmp_path / "afile"), capsule.id, cwd=capsule.cwd))
    assert isinstance(out, dict)
    # An existing file is no more a repository than a missing path.
    refused(out, "RepositoryNotFound", f"no sojourn repository at {tmp_path / 'afile'}")
    assert not capsule.marker.exists()


# -- writes that cannot happen: not writable, disk full ------------------------------------------


CAPTURE_NEW = """
import sys, json, os
import numpy as np
import sojourn
try:
    sojourn.capture({"fresh": np.random.default_rng(int(sys.argv[2])).random(int(sys.argv[3]))}, sys.argv[1])
    out = {"ok": True}
except BaseException as e:
    out = {"ok": False, "error": type(e).__name__, "message": str(e)}
print(json.dumps(out))
"""


def _script_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(SRC), PYTHONDONTWRITEBYTECODE="1")
    env.update(extra)
    return env


def _leftovers(repo: Path) -> list[str]:
    return [str(p) for p in repo.rglob("*") if p.name.startswith(".tmp")]


def _unshare(*, mount: str) -> list[str]:
    """``unshare`` argv for a private mount namespace in which ``mount`` (sh) runs first."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1) to mount a file system for this test")
    flags = ["--mount", "--propagation", "private"]
    if os.geteuid() != 0:
        flags = ["--user", "--map-root-user", *flags]
    argv = ["unshare", *flags, "sh", "-c", f"{mount} && exec \"$@\"", "sh"]
    probe = subprocess.run([*argv[:-4], "sh", "-c", "mount -t tmpfs -o size=1m probe /tmp"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount in a private mount namespace here: {probe.stderr.strip()}")
    return argv


def _previous_capsule(repo: Path, cwd: Path) -> str:
    out = last_json(run_py(CAPTURE_NEW, str(repo), "1", "1000", cwd=cwd))
    assert out == {"ok": True}
    (cap,) = LocalBackend(repo).list("capsules")
    return cap.removesuffix(".json")


def _assert_intact(repo: Path, cap: str, cwd: Path) -> None:
    out = last_json(run_py(RESTORE, str(repo), cap, cwd=cwd))
    assert out == {"ok": True, "names": ["fresh"]}, out
    assert list(LocalBackend(repo).list("capsules")) == [cap + ".json"]
    assert _leftovers(repo) == []


def _shut_out(repo: Path) -> list[str]:
    """Make ``repo`` belong to someone else; return an argv prefix for a user it shuts out."""
    if os.geteuid() != 0:
        for p in [repo, *repo.rglob("*")]:
            if p.is_dir():
                p.chmod(0o555)
        return []
    # Root ignores permission bits through two capabilities: give the repository to nobody
    # and run the child without them, so that it is an ordinary user to the kernel. (Switching
    # to nobody outright fails where the interpreter lives under root's private home.)
    if shutil.which("setpriv") is None:
        pytest.skip("needs setpriv(1) to drop root's permission-override capabilities")
    for p in [repo, *repo.rglob("*")]:
        os.chown(p, 65534, 65534)
    prefix = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
    probe = subprocess.run(
        [*prefix, sys.executable, "-c", "import sys; open(sys.argv[1] + '/probe', 'w')", str(repo)],
        capture_output=True, text=True,
    )
    if probe.returncode == 0:
        os.unlink(repo / "probe")
        pytest.skip("dropping CAP_DAC_OVERRIDE did not stop root writing here")
    assert "PermissionError" in probe.stderr, probe.stderr
    return prefix


def _give_back(repo: Path) -> None:
    for p in [repo, *repo.rglob("*")]:
        if os.geteuid() == 0:
            os.chown(p, 0, 0)
        if p.is_dir():
            p.chmod(0o755)


def test_a_repository_that_is_not_writable_by_this_user(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    cap = _previous_capsule(repo, tmp_path)
    key = open_repository(repo).key.hex()
    script = tmp_path / "capture_new.py"
    script.write_text(textwrap.dedent(CAPTURE_NEW))
    prefix = _shut_out(repo)
    try:
        proc = subprocess.run(
            [*prefix, sys.executable, str(script), str(repo), "2", "300000"],
            capture_output=True, text=True, cwd=tmp_path, env=_script_env(SOJOURN_KEY=key),
        )
    finally:
        _give_back(repo)
    out = last_json(proc)
    assert isinstance(out, dict)
    refused(out, "RepositoryError", "permission denied while", "not writable by this user", "--repo / $SOJOURN_REPO")
    _assert_intact(repo, cap, tmp_path)


def test_a_read_only_repository(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    cap = _previous_capsule(repo, tmp_path)
    argv = _unshare(mount=f"mount --bind '{repo}' '{repo}' && mount -o remount,bind,ro '{repo}'")
    script = tmp_path / "capture_new.py"
    script.write_text(textwrap.dedent(CAPTURE_NEW))
    proc = subprocess.run(
        [*argv, sys.executable, str(script), str(repo), "2", "300000"],
        capture_output=True, text=True, cwd=tmp_path, env=_script_env(),
    )
    out = last_json(proc)
    assert isinstance(out, dict)
    refused(out, "RepositoryError", "permission denied while", "not writable by this user")
    _assert_intact(repo, cap, tmp_path)


DISK_FULL = """
import sys, json, os, subprocess
mount, restore = sys.argv[1], sys.argv[2]
repo = os.path.join(mount, "repo")
run = lambda *args: json.loads(subprocess.run([sys.executable, *args], capture_output=True, text=True,
                                              check=True).stdout.strip().splitlines()[-1])
out = {"first": run(sys.argv[3], repo, "1", "1000")}
out["cap"] = sorted(os.listdir(os.path.join(repo, "capsules")))
# 24 MB of floats into a 6 MB file system: the chunk writes run out of space.
out["second"] = run(sys.argv[3], repo, "2", "3000000")
out["capsules"] = sorted(os.listdir(os.path.join(repo, "capsules")))
out["leftovers"] = [os.path.join(d, f) for d, _, fs in os.walk(repo) for f in fs if f.startswith(".tmp")]
out["restore"] = run(restore, repo, out["cap"][0].removesuffix(".json"))
st = os.statvfs(mount)
out["free"] = st.f_bavail * st.f_frsize
print(json.dumps(out))
"""


def test_disk_full_during_capture_keeps_the_previous_capsule(tmp_path: Path) -> None:
    mnt = tmp_path / "small-disk"
    mnt.mkdir()
    argv = _unshare(mount=f"mount -t tmpfs -o size=6m sojourn-full '{mnt}'")
    for name, code in {"driver.py": DISK_FULL, "capture_new.py": CAPTURE_NEW, "restore.py": RESTORE}.items():
        (tmp_path / name).write_text(textwrap.dedent(code))
    proc = subprocess.run(
        [*argv, sys.executable, str(tmp_path / "driver.py"), str(mnt), str(tmp_path / "restore.py"),
         str(tmp_path / "capture_new.py")],
        capture_output=True, text=True, cwd=tmp_path, env=_script_env(),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["first"] == {"ok": True} and len(out["cap"]) == 1
    refused(out["second"], "RepositoryError", "no space left on the device", "the previous capsules are intact")
    assert out["capsules"] == out["cap"], "a capsule was published by the failed capture"
    assert out["leftovers"] == []
    assert out["restore"] == {"ok": True, "names": ["fresh"]}
