"""The repository id and key: an id from the config never names a path it should not, and a
key (or its directory) that others can read or have planted is refused, as ssh does."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sojourn.errors import IntegrityError, RepositoryError
from sojourn.repository.repo import key_path, open_repository, sojourn_home
from tests.conftest import run_py

needs_root = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to act as another user")
NOBODY = 65534


def _config(repo: Path) -> dict[str, object]:
    doc = json.loads((repo / "config" / "config.json").read_text())
    assert isinstance(doc, dict)
    return doc


def _set_config(repo: Path, doc: dict[str, object]) -> None:
    (repo / "config" / "config.json").write_text(json.dumps(doc))


def test_an_id_that_climbs_out_of_the_keys_directory_runs_nothing(tmp_path: Path) -> None:
    """The attack: a config id that walks from ~/.sojourn/keys into the repository, a key
    planted there, and a capsule signed with it whose restore runs code."""
    attacker_home, victim_home = tmp_path / "attacker-home", tmp_path / "victim-home"
    attacker_repo, victim = tmp_path / "attacker-repo", tmp_path / "victim"
    mark = tmp_path / "code-ran"
    made = run_py(
        f"""
import json, sys, sojourn
class Payload:
    open({str(mark)!r}, "w").write("ran")   # runs again wherever the class is rebuilt
x = Payload()
print(json.dumps(sojourn.capture(globals(), sys.argv[1]).id))
""",
        str(attacker_repo), cwd=tmp_path, env={"SOJOURN_HOME": str(attacker_home)},
    )
    cap = json.loads(made.stdout.strip().splitlines()[-1])
    mark.unlink()
    run_py("import sys, sojourn; sojourn.capture({'y': 1}, sys.argv[1])", str(victim), cwd=tmp_path,
           env={"SOJOURN_HOME": str(victim_home)})
    # the attacker can write the repository, not the victim's home
    for kind in ("capsules", "chunks"):
        shutil.copytree(attacker_repo / kind, victim / kind, dirs_exist_ok=True)
    (attacker_key,) = (attacker_home / "keys").iterdir()
    shutil.copy(attacker_key, victim / "config" / "evil.key")
    doc = _config(victim)
    doc["id"] = os.path.relpath(victim / "config" / "evil", victim_home / "keys")
    _set_config(victim, doc)

    out = run_py("import sys, sojourn; sojourn.restore(sys.argv[1], sys.argv[2])", cap, str(victim), cwd=tmp_path,
                 env={"SOJOURN_HOME": str(victim_home)}, check=False)
    assert not mark.exists(), "the planted capsule's code ran"
    assert out.returncode != 0
    assert "IntegrityError" in out.stderr and "is not a repository id" in out.stderr, out.stderr


@pytest.mark.parametrize("bad", ["../x", "repo_../../etc/passwd", "repo_ABC0123456789", "repo_12", "", 7, None,
                                 "repo_0123456789abcdef/", "repo_0123456789abcdef\x00"])
def test_ids_that_are_not_repository_ids_are_refused_before_any_key_is_read(repo: str, bad: object) -> None:
    open_repository(repo, create=True).close()
    doc = _config(Path(repo))
    doc["id"] = bad
    _set_config(Path(repo), doc)
    with pytest.raises(IntegrityError, match=r"is not a repository id .*the config was altered"):
        open_repository(repo)


def test_a_new_key_and_its_directory_are_private_whatever_the_umask(repo: str) -> None:
    old = os.umask(0)
    try:
        with open_repository(repo, create=True) as r:
            path = key_path(r.id)
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


def test_a_keys_directory_open_to_others_is_refused_with_the_fix(repo: str) -> None:
    with open_repository(repo, create=True):
        pass
    keys = sojourn_home() / "keys"
    keys.chmod(0o755)
    with pytest.raises(RepositoryError, match=rf"keys directory {keys} is open to other users \(mode 0755\).*`chmod 700 {keys}`"):
        open_repository(repo)
    keys.chmod(0o700)
    open_repository(repo).close()


@pytest.mark.parametrize("mode", [0o644, 0o666, 0o640, 0o604])
def test_a_key_others_can_read_or_write_is_refused_with_the_fix(repo: str, mode: int) -> None:
    with open_repository(repo, create=True) as r:
        path = key_path(r.id)
    path.chmod(mode)
    with pytest.raises(RepositoryError, match=rf"key file {path} is open to other users \(mode {mode:04o}\).*`chmod 600 {path}`"):
        open_repository(repo)
    path.chmod(0o600)
    open_repository(repo).close()


def test_a_missing_key_says_where_to_put_it(repo: str) -> None:
    with open_repository(repo, create=True) as r:
        path = key_path(r.id)
    path.unlink()
    with pytest.raises(RepositoryError, match=rf"no signing key for repository {r.id}.*copy {path}.*chmod 600"):
        open_repository(repo)


@needs_root
def test_a_key_planted_by_another_user_is_refused(repo: str, tmp_path: Path) -> None:
    with open_repository(repo, create=True) as r:
        path = key_path(r.id)
    os.chown(path, NOBODY, -1)
    with pytest.raises(RepositoryError, match=rf"{path} belongs to uid {NOBODY}, not to this user.*planted"):
        open_repository(repo)
    # a link to another user's file is that user's file
    theirs = tmp_path / "theirs.key"
    theirs.write_text(path.read_text())
    theirs.chmod(0o600)
    os.chown(theirs, NOBODY, -1)
    path.unlink()
    path.symlink_to(theirs)
    with pytest.raises(RepositoryError, match=f"belongs to uid {NOBODY}"):
        open_repository(repo)


@pytest.fixture
def shared_home(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A SOJOURN_HOME another user can walk to (pytest's temporary directories are 0700)."""
    base = Path(tempfile.mkdtemp(prefix="sojourn-keys-"))
    base.chmod(0o755)
    monkeypatch.setenv("SOJOURN_HOME", str(base / "home"))
    yield base / "home"
    shutil.rmtree(base)


def _read_as_nobody(path: Path) -> subprocess.CompletedProcess[str]:
    def drop() -> None:
        os.setgid(NOBODY)
        os.setuid(NOBODY)

    return subprocess.run(["cat", str(path)], capture_output=True, text=True, preexec_fn=drop, timeout=60, cwd="/")


@needs_root
def test_another_user_cannot_read_the_key_and_a_readable_one_is_not_used(shared_home: Path, tmp_path: Path) -> None:
    repo = Path(tempfile.mkdtemp(prefix="sojourn-repo-", dir=shared_home.parent))
    shutil.rmtree(repo)
    with open_repository(str(repo), create=True) as r:
        path = key_path(r.id)
    shared_home.chmod(0o755)  # as a home directory usually is
    got = _read_as_nobody(path)
    assert got.returncode != 0 and "Permission denied" in got.stderr
    # Opened up (a copy with the wrong mode, an old keys directory at 0755): the other user
    # can read it now, and sojourn refuses to go on trusting it.
    path.parent.chmod(0o755)
    path.chmod(0o644)
    got = _read_as_nobody(path)
    assert got.returncode == 0 and len(got.stdout.strip()) == 64
    with pytest.raises(RepositoryError, match="open to other users"):
        open_repository(str(repo))
