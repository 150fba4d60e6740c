"""Running the `sojourn` command in real processes, against a real repository.

``Shell`` runs ``python -m sojourn.cli.main`` (the installed ``sojourn`` command's code) in a
scratch directory with its own repository, transform cache and SOJOURN_HOME, in the
foreground (``cli``) or in the background (``start``), and reads workspace records back
through ``show --json``. Scripts get a prelude with ``kill_here(tag)``, which sends the
process a real signal at points named by the ``KILLS`` environment variable.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import KILL_PRELUDE as PRELUDE
from tests.conftest import SRC

WS_RE = re.compile(r"workspace (ws_[0-9a-f]+)")


class Shell:
    def __init__(self, tmp_path: Path):
        self.dir = tmp_path / "work"
        self.dir.mkdir()
        self.repo = str(tmp_path / "repo")
        self.env = dict(os.environ)
        self.env["PYTHONPATH"] = str(SRC) + (os.pathsep + self.env["PYTHONPATH"] if self.env.get("PYTHONPATH") else "")
        self.env["SOJOURN_CACHE"] = str(tmp_path / "cache")
        self.env["SOJOURN_REPO"] = self.repo
        self.env["COLUMNS"] = "200"
        self.env.pop("KILLS", None)
        self.procs: list[subprocess.Popen[str]] = []

    def write(self, name: str, body: str, prelude: bool = True) -> Path:
        path = self.dir / name
        path.write_text((PRELUDE if prelude else "") + textwrap.dedent(body))
        return path

    def plain(self, script: str, *args: str) -> str:
        env = dict(self.env)
        p = subprocess.run([sys.executable, script, *args], cwd=self.dir, env=env, capture_output=True, text=True,
                           timeout=120)
        assert p.returncode == 0, p.stderr
        return p.stdout

    def cmd(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "sojourn.cli.main", *args]

    def cli(self, *args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.cmd(*args), cwd=self.dir, env=dict(self.env, **(env or {})), capture_output=True,
                              text=True, timeout=timeout)

    def start(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        p = subprocess.Popen(self.cmd(*args), cwd=self.dir, env=dict(self.env, **(env or {})), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        self.procs.append(p)
        return p

    def json(self, *args: str) -> Any:
        p = self.cli(*args, "--json")
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)

    def show(self, ws: str) -> dict[str, Any]:
        return dict(self.json("show", ws))

    def show_id(self, stderr: str) -> str:
        m = WS_RE.search(stderr)
        assert m, stderr
        return m.group(1)

    def workspace_of(self, proc: subprocess.Popen[str]) -> str:
        """Read the run's stderr up to the line that names its workspace."""
        assert proc.stderr is not None
        seen = ""
        while True:
            line = proc.stderr.readline()
            if not line:
                raise AssertionError(f"the run ended before naming its workspace:\n{seen}")
            seen += line
            m = WS_RE.search(line)
            if m:
                return m.group(1)

    def read_lines(self, proc: subprocess.Popen[str], n: int) -> list[str]:
        assert proc.stdout is not None
        lines = []
        while len(lines) < n:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
        return lines

    def session_pid(self, ws: str, timeout: float = 30) -> int:
        def pid() -> int | None:
            allocs = self.show(ws)["allocations"]
            return allocs[-1]["session_pid"] if allocs and allocs[-1]["ended"] is None else None

        return int(wait_for(pid, timeout, f"the session of {ws} to start"))

    def kill_all(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.communicate()


def settled_record(rec: dict[str, Any], live: list[int]) -> dict[str, Any] | None:
    """``rec`` when a workspace has settled after a move or a fault: one session runs and the
    record names it as the holder's, or none runs and the record is not `running`."""
    if rec["state"] == "running":
        open_ = [a for a in rec["allocations"] if a["ended"] is None]
        if len(live) == 1 and len(open_) == 1 and open_[0]["id"] == rec["holder"] \
                and open_[0]["session_pid"] == live[0]:
            return rec
        return None
    return rec if not live else None


def wait_for(pred: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def finish(proc: subprocess.Popen[str], timeout: float = 120) -> tuple[int, str, str]:
    """Wait for ``proc`` and read the rest of its output through the same buffered files that
    ``read_lines``/``workspace_of`` read from: ``communicate()`` reads the pipes' descriptors
    itself and drops what those files had buffered already (lines lost when output comes in
    bursts, on a loaded machine)."""
    import threading

    got: dict[str, str] = {}

    def read(name: str, f: Any) -> None:
        got[name] = f.read() if f is not None else ""

    readers = [threading.Thread(target=read, args=(n, f), daemon=True)
               for n, f in (("out", proc.stdout), ("err", proc.stderr))]
    for t in readers:
        t.start()
    deadline = time.monotonic() + timeout
    for t in readers:
        t.join(max(0.0, deadline - time.monotonic()))
    if any(t.is_alive() for t in readers):
        proc.kill()
        raise subprocess.TimeoutExpired(proc.args, timeout)
    proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    return proc.returncode, got["out"], got["err"]


@pytest.fixture
def sh(tmp_path: Path) -> Iterator[Shell]:
    s = Shell(tmp_path)
    yield s
    s.kill_all()


def kill(pid: int, sig: int = signal.SIGKILL) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


@pytest.fixture(scope="session")
def ws_s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The S3-compatible server of tests/repository (one per test session: reused when those
    tests started it already)."""
    pytest.importorskip("boto3", reason="the S3 tests need boto3 (pip install 'sojourn[s3]')")
    from tests.repository import conftest as repo_conftest
    from tests.repository.s3server import start_s3_server

    if repo_conftest._USED:
        yield repo_conftest._USED[-1]
        return
    try:
        server = start_s3_server(tmp_path_factory.mktemp("s3-workspace"))
    except Exception as e:
        pytest.fail(f"no S3-compatible server for the S3 tests: {e}", pytrace=False)
    repo_conftest._USED.append(server)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def ws_s3_url(ws_s3_server: Any, monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A fresh prefix in a bucket of the test server, with boto3 pointed at it."""
    import uuid

    from tests.repository.s3server import s3_client

    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN", "AWS_REGION"):
        monkeypatch.delenv(name, raising=False)
    missing = tmp_path_factory.mktemp("aws") / "none"
    monkeypatch.setenv("AWS_CONFIG_FILE", str(missing))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(missing))
    for name, value in ws_s3_server.env().items():
        monkeypatch.setenv(name, value)
    client = s3_client(ws_s3_server)
    try:
        client.create_bucket(Bucket="sojourn-workspace-tests")
    except client.exceptions.BucketAlreadyOwnedByYou:
        pass
    return f"s3://sojourn-workspace-tests/t-{uuid.uuid4().hex[:12]}"
