"""The S3-compatible server the S3 tests run against (see ``s3server.py``)."""

from __future__ import annotations

import uuid
import warnings
from collections.abc import Iterator

import pytest

from tests.repository.s3server import S3Server, s3_client, start_s3_server

BUCKET = "sojourn-tests"
_USED: list[S3Server] = []


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[S3Server]:
    pytest.importorskip("boto3", reason="the S3 tests need boto3 (pip install 'sojourn[s3]')")
    try:
        server = start_s3_server(tmp_path_factory.mktemp("s3-radosgw"))
    except Exception as e:
        pytest.fail(f"no S3-compatible server for the S3 tests: {e}", pytrace=False)
    _USED.append(server)
    if server.kind == "moto":
        reporter = request.config.pluginmanager.get_plugin("terminalreporter")
        banner = f"WARNING: S3 TESTS ARE NOT RUNNING AGAINST A REAL SERVER. {server.note}"
        if reporter is not None:
            reporter.write_line("")
            reporter.write_line(banner, red=True, bold=True)
        warnings.warn(banner, UserWarning, stacklevel=1)
    try:
        yield server
    finally:
        server.stop()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for server in _USED:
        line = f"S3 tests ran against {server.kind} at {server.endpoint}"
        if server.seconds:
            line += f" (started in {server.seconds:.1f} s)"
        if server.note:
            line += f"; {server.note}"
        terminalreporter.write_line(line, red=server.kind == "moto", bold=server.kind == "moto")


@pytest.fixture
def s3_env(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> S3Server:
    """Point boto3 at the test server, away from the user's own AWS configuration."""
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN", "AWS_REGION"):
        monkeypatch.delenv(name, raising=False)
    missing = tmp_path_factory.mktemp("aws") / "none"
    monkeypatch.setenv("AWS_CONFIG_FILE", str(missing))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(missing))
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    return s3_server


@pytest.fixture(scope="session")
def s3_bucket(s3_server: S3Server) -> str:
    client = s3_client(s3_server)
    try:
        client.create_bucket(Bucket=BUCKET)
    except client.exceptions.BucketAlreadyOwnedByYou:
        pass
    return BUCKET


@pytest.fixture
def s3_url(s3_env: S3Server, s3_bucket: str) -> str:
    """A fresh prefix in the shared test bucket."""
    return f"s3://{s3_bucket}/t-{uuid.uuid4().hex[:12]}"
