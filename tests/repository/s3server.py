"""An S3-compatible server for the tests: a real Ceph radosgw, started here when needed.

Order of preference:

1. ``SOJOURN_TEST_S3_ENDPOINT`` names a server that is already running (keys from
   ``SOJOURN_TEST_S3_ACCESS_KEY`` / ``SOJOURN_TEST_S3_SECRET_KEY``, default SOJOURNKEY /
   SOJOURNSECRET, the keys ``tools/s3-radosgw`` creates);
2. radosgw started by ``tools/s3-radosgw`` on free ports (it apt-installs Ceph on first use,
   which needs root);
3. only if that fails, and ``SOJOURN_TEST_S3_REQUIRE_RADOSGW`` is not set: moto's server, a
   mock of the S3 HTTP API rather than a storage system. The fixture says so loudly.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RADOSGW_SCRIPT = ROOT / "tools" / "s3-radosgw"
DEFAULT_KEY, DEFAULT_SECRET = "SOJOURNKEY", "SOJOURNSECRET"
# The first start may apt-install Ceph (about 40 s here); leave room for slow mirrors, but
# stay under pytest-timeout's 600 s for the test whose setup starts the server.
START_TIMEOUT = float(os.environ.get("SOJOURN_TEST_S3_START_TIMEOUT", "540"))


@dataclass
class S3Server:
    endpoint: str
    access_key: str
    secret_key: str
    kind: str  # "external", "radosgw" or "moto"
    seconds: float = 0.0
    note: str = ""
    _stop: list[str] = field(default_factory=list, repr=False)
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def env(self) -> dict[str, str]:
        """Environment variables that point boto3 (and so sojourn) at this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def stop(self) -> None:
        if self._stop:
            subprocess.run(self._stop, capture_output=True, timeout=60)
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answers(endpoint: str) -> bool:
    try:
        urllib.request.urlopen(endpoint, timeout=2)
    except urllib.error.HTTPError:
        return True  # any HTTP answer (403 for an anonymous request) means it is up
    except OSError:
        return False
    return True


def start_radosgw(state_dir: Path) -> S3Server:
    port, mon_port = free_port(), free_port()
    env = dict(os.environ, S3_RADOSGW_PORT=str(port), S3_RADOSGW_MON_PORT=str(mon_port))
    stop = [str(RADOSGW_SCRIPT), "stop", str(state_dir)]
    t0 = time.monotonic()
    # Its own session, so that a timeout can stop the script and whatever it is waiting on.
    proc = subprocess.Popen(
        [str(RADOSGW_SCRIPT), "start", str(state_dir)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=START_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        subprocess.run(stop, capture_output=True, timeout=60)
        raise RuntimeError(f"tools/s3-radosgw did not start within {START_TIMEOUT:.0f} s") from None
    seconds = time.monotonic() - t0
    if proc.returncode != 0 or "S3 ready" not in stdout:
        subprocess.run(stop, capture_output=True, timeout=60)
        raise RuntimeError(
            f"tools/s3-radosgw failed (exit code {proc.returncode}):\n{stdout[-2000:]}{stderr[-4000:]}"
        )
    note = " ".join(ln for ln in stderr.splitlines() if "installed in" in ln)
    return S3Server(
        f"http://127.0.0.1:{port}", DEFAULT_KEY, DEFAULT_SECRET, "radosgw", seconds, note, _stop=stop
    )


def start_moto() -> S3Server:
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    server = S3Server(endpoint, DEFAULT_KEY, DEFAULT_SECRET, "moto", _proc=proc)
    deadline = time.monotonic() + 60
    while not _answers(endpoint):
        if proc.poll() is not None or time.monotonic() > deadline:
            server.stop()
            raise RuntimeError(f"moto's server did not start on {endpoint} (exit code {proc.poll()})")
        time.sleep(0.2)
    server.seconds = time.monotonic() - t0
    return server


def start_s3_server(state_dir: Path) -> S3Server:
    endpoint = os.environ.get("SOJOURN_TEST_S3_ENDPOINT")
    if endpoint:
        return S3Server(
            endpoint,
            os.environ.get("SOJOURN_TEST_S3_ACCESS_KEY", DEFAULT_KEY),
            os.environ.get("SOJOURN_TEST_S3_SECRET_KEY", DEFAULT_SECRET),
            "external",
        )
    try:
        return start_radosgw(state_dir)
    except (RuntimeError, OSError) as e:
        if os.environ.get("SOJOURN_TEST_S3_REQUIRE_RADOSGW"):
            raise RuntimeError(f"radosgw is required (SOJOURN_TEST_S3_REQUIRE_RADOSGW) but: {e}") from e
        server = start_moto()
        server.note = f"radosgw could not be started, so these tests ran against moto's mock: {e}"
        return server


def s3_client(server: S3Server) -> Any:
    import boto3
    import botocore.config

    return boto3.session.Session().client(
        "s3",
        endpoint_url=server.endpoint,
        aws_access_key_id=server.access_key,
        aws_secret_access_key=server.secret_key,
        region_name="us-east-1",
        config=botocore.config.Config(s3={"addressing_style": "path"}),
    )


def new_bucket_name() -> str:
    return f"sj-{uuid.uuid4().hex[:20]}"
