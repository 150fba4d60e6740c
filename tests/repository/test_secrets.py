"""Secrets stay home: credential files are left out of workspace files unless taken on
purpose, and no environment variable lands in the repository, whatever writes it."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

import sojourn
from sojourn.capsule.secrets import Secrets
from sojourn.errors import SojournWarning
from sojourn.repository.repo import open_repository
from tests.conftest import run_py

SECRET = "AKIAEXAMPLESECRET-7f3c9a"

CREDENTIALS = [
    ".env", ".env.local", "app/.env.production", ".envrc", ".netrc", ".git-credentials", ".pypirc",
    ".aws/credentials", ".aws/config", ".ssh/id_ed25519", ".ssh/known_hosts", "certs/server.pem", "keys/api.key",
    ".config/gcloud/application_default_credentials.json", ".azure/accessTokens.json", ".kube/config",
    ".docker/config.json", "deploy/id_rsa",
]
ORDINARY = ["train.py", "data/x.csv", ".kube/cache/discovery.json", ".docker/README", "environment.yml",
            ".config/app.toml", "keys.py", "notes/.environ-notes.txt"]


def _workspace(tmp_path: Path) -> Path:
    d = tmp_path / "work"
    for rel in CREDENTIALS + ORDINARY:
        p = d / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(f"{rel}: {SECRET}\n" if rel in CREDENTIALS else f"{rel}\n")
    return d


def _restored(repo: str, cap: str, tmp_path: Path) -> set[str]:
    dest = tmp_path / f"restored-{cap}"
    run_py("import sys, sojourn; sojourn.restore(sys.argv[2], sys.argv[1], files_to=sys.argv[3])", repo, cap, str(dest),
           cwd=tmp_path)
    return {p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()}


def test_credential_files_stay_home_and_are_named(tmp_path: Path, repo: str) -> None:
    work = _workspace(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ref = sojourn.capture({"x": 1}, repo, files=str(work))
    (warning,) = [w for w in caught if issubclass(w.category, SojournWarning)]
    text = str(warning.message)
    assert "credential files stayed on this machine" in text and "include_secrets" in text
    for name in (".env", "app/.env.production", ".aws/", ".ssh/", "certs/server.pem", ".kube/config",
                 ".docker/config.json", ".config/gcloud/"):
        assert name in text, name
    assert _restored(repo, ref.id, tmp_path) == set(ORDINARY)
    info = sojourn.inspect(ref.id, repo)
    assert {f["path"] for f in info.files} == set(ORDINARY)
    with open_repository(repo) as r:
        from sojourn.capsule import format as fmt

        files = fmt.load_manifest(r, ref.id).files or {}
        assert ".env" in files["secrets"] and ".aws/" in files["secrets"]
        assert any(s == "secret: .aws/ (credentials stay on this machine)" for s in files["skipped"])
    # not one byte of them went into the repository (a plain one: readable as it is)
    for p in Path(repo).rglob("*"):
        if p.is_file():
            assert SECRET.encode() not in p.read_bytes(), p


def test_credentials_are_taken_only_on_purpose(tmp_path: Path, repo: str, monkeypatch: pytest.MonkeyPatch) -> None:
    work = _workspace(tmp_path)
    ref = sojourn.capture({}, repo, files=str(work), include_secrets=[".env", ".aws/credentials"])
    got = _restored(repo, ref.id, tmp_path)
    assert got == set(ORDINARY) | {".env", ".aws/credentials"}
    ref = sojourn.capture({}, repo, files=str(work), include_secrets=True)
    assert _restored(repo, ref.id, tmp_path) == set(ORDINARY) | set(CREDENTIALS)
    # commands that take no argument for it (`sojourn run --on`) read the environment
    monkeypatch.setenv("SOJOURN_INCLUDE_SECRETS", "certs/server.pem,.ssh/")
    ref = sojourn.capture({}, repo, files=str(work))
    assert _restored(repo, ref.id, tmp_path) == set(ORDINARY) | {"certs/server.pem", ".ssh/id_ed25519", ".ssh/known_hosts"}


def test_the_files_a_run_on_a_machine_copies_leave_them_out(tmp_path: Path, repo: str) -> None:
    from sojourn.workspace import files

    work = _workspace(tmp_path)
    with open_repository(repo, create=True) as r, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        snap = files.snapshot(r, work, workspace=None)
        dest = tmp_path / "machine-scratch"
        files.materialize(r, snap.capsule, dest)
    assert {p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()} == set(ORDINARY)
    assert any("secret: .env (" in s for s in snap.skipped)
    assert any(".git-credentials" in str(w.message) for w in caught)


@pytest.mark.parametrize(("rel", "is_dir", "left_out"), [
    (".env", False, True), ("a/b/.env.test", False, True), (".env", True, True), ("x.pem", False, True),
    (".aws", True, True), ("sub/.ssh", True, True), (".aws", False, False), (".kube/config", False, True),
    (".kube", True, False), ("kube/config", False, False), ("config", False, False), ("my.keys", False, False),
    (".config/gcloud", True, True), ("gcloud", True, False),
])
def test_what_counts_as_a_credential(rel: str, is_dir: bool, left_out: bool) -> None:
    assert Secrets([]).leaves_out(rel, is_dir) is left_out


@pytest.mark.slow
def test_no_environment_variable_lands_in_the_repository(tmp_path: Path) -> None:
    """A workspace run, paused and resumed with a secret in its environment: nothing the
    supervisor, the session or the capsule wrote holds its name or value."""
    from tests.workspace.conftest import Shell, finish

    sh = Shell(tmp_path)
    try:
        sh.write("job.py", """
import os, time
seen = len(os.environ) > 0          # the program may read its environment
for i in range(400):
    time.sleep(0.05)
    if i == 5:
        print("started", flush=True)
print("done", seen)
""")
        env = {"MY_API_TOKEN": SECRET, "SOJOURN_TEST_MARK": SECRET + "-2"}
        run = sh.start("run", "--name", "envjob", "job.py", env=env)
        ws = sh.workspace_of(run)
        assert sh.read_lines(run, 1) == ["started\n"]
        sus = sh.cli("suspend", ws, env=env)
        assert sus.returncode == 0, sus.stderr
        code, _, err = finish(run)
        assert code == 75, err
        res = sh.cli("resume", ws, env=env, timeout=300)
        assert res.returncode == 0 and "done True" in res.stdout, res.stderr
    finally:
        sh.kill_all()
    rec = json.loads(sh.cli("show", ws, "--json").stdout)
    assert rec["state"] == "finished" and len(rec["capsules"]) == 1
    objects = [p for p in Path(sh.repo).rglob("*") if p.is_file()]
    assert any("event." in p.name for p in objects) and any(p.parent.name == "capsules" for p in objects)
    for p in objects:
        blob = p.read_bytes()
        assert SECRET.encode() not in blob and b"MY_API_TOKEN" not in blob, p
