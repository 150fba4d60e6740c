"""Objects that cannot travel: capture refuses, naming every one with its path and why."""

from __future__ import annotations

import logging
import os
import socket
import sqlite3
import subprocess
import sys
import threading
import zlib
from pathlib import Path

import pytest

import sojourn
from sojourn.errors import CaptureError


class Log:
    """A logger-like object that travels by value (logging.Logger travels by name)."""

    def __init__(self) -> None:
        self.handlers: list[logging.Handler] = []


class Trainer:
    def __init__(self) -> None:
        self.logger = Log()
        self.steps = 0


@pytest.fixture
def hostile():
    sock = socket.socket()
    thread = threading.Thread(target=lambda: None)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    held = threading.Lock()
    held.acquire()
    trainer = Trainer()
    handler = logging.StreamHandler()
    handler.stream = sock  # a log handler writing to a socket, two levels down
    trainer.logger.handlers.append(handler)
    ns = {
        "trainer": trainer,
        "workers": [thread],
        "child": proc,
        "state": {"lock": held, "db": sqlite3.connect(":memory:")},
        "codec": zlib.compressobj(),
        "fine": [1, 2, 3],
        "free_lock": threading.Lock(),
    }
    yield ns
    proc.kill()
    proc.wait()
    sock.close()
    held.release()


def test_capture_lists_every_problem_with_its_path(hostile, repo: str) -> None:
    with pytest.raises(CaptureError) as info:
        sojourn.capture(hostile, repo)
    paths = {p.path: p for p in info.value.problems}
    assert set(paths) >= {
        "trainer.logger.handlers[0].stream",
        "workers[0]",
        "child",
        "state['lock']",
        "state['db']",
        "codec",
    }, paths
    assert "socket" in paths["trainer.logger.handlers[0].stream"].reason
    assert "thread" in paths["workers[0]"].reason
    assert "held" in paths["state['lock']"].reason
    assert "zlib" in paths["codec"].type.lower() or "pickl" in paths["codec"].reason
    message = str(info.value)
    assert "trainer.logger.handlers[0].stream" in message and "nothing was written" in message
    # Nothing was written: no capsule in the repository.
    capsules = Path(repo) / "capsules"
    assert not capsules.exists() or not any(capsules.iterdir())


def test_scan_reports_the_same_without_writing(hostile, tmp_path: Path) -> None:
    before = set(os.listdir(tmp_path))
    problems = sojourn.scan(hostile)
    assert {p.path for p in problems} >= {"trainer.logger.handlers[0].stream", "workers[0]", "child", "codec"}
    assert "free_lock" not in {p.path for p in problems}
    assert "fine" not in {p.path for p in problems}
    assert set(os.listdir(tmp_path)) == before


def test_scan_of_a_clean_namespace_is_empty() -> None:
    assert sojourn.scan({"a": [1, {"b": (2, 3)}], "lock": threading.Lock(), "ev": threading.Event()}) == []


def test_free_lock_and_event_travel(repo: str, tmp_path: Path) -> None:
    from tests.conftest import run_py

    ref = sojourn.capture({"lock": threading.Lock(), "rlock": threading.RLock(), "ev": threading.Event()}, repo)
    out = run_py(
        """
import sys, sojourn
ns = sojourn.restore(sys.argv[2], sys.argv[1])
assert ns["lock"].acquire(blocking=False)
assert ns["rlock"].acquire(blocking=False)
ns["ev"].set(); assert ns["ev"].is_set()
print("ok")
""",
        repo,
        ref.id,
        cwd=tmp_path,
    )
    assert out.stdout.strip() == "ok"
