"""Store faults, the backend part: transient ones are retried with backoff and a status line
up to a deadline; permanent ones fail at once with a precise message; a repository that
vanished or was replaced is never written into (nor silently re-created)."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from sojourn.errors import (
    AlreadyExists,
    ObjectNotFound,
    RepositoryChanged,
    RepositoryError,
    RepositoryNotFound,
    StoreUnavailable,
)
from sojourn.repository.repo import Repository, open_repository
from sojourn.repository.retry import RetryPolicy
from tests.repository.faultproxy import FaultProxy
from tests.repository.s3server import S3Server

ROOT_ONLY = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="mounts need root")


class Lines(list[str]):
    def __call__(self, line: str) -> None:
        self.append(line)


def _open(url: str, lines: Lines, budget: float = 30.0, **kw: Any) -> Repository:
    return open_repository(url, policy=RetryPolicy(url, budget=budget, on_status=lines), **kw)


def _fail_os(monkeypatch: pytest.MonkeyPatch, name: str, err: int, times: int | None,
             when: Callable[[], bool] = lambda: True) -> list[int]:
    """``os.<name>`` raises ``err`` its first ``times`` calls (None: always) while ``when()``."""
    real = getattr(os, name)
    count = [0]

    def failing(*args: Any, **kw: Any) -> Any:
        if when() and (times is None or count[0] < times):
            count[0] += 1
            raise OSError(err, os.strerror(err))
        return real(*args, **kw)

    monkeypatch.setattr(os, name, failing)
    return count


# -- local: transient faults are retried, visibly ---------------------------------------------


def test_eio_while_writing_chunks_is_retried_and_the_capture_lands(repo: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy as np

    from sojourn.capsule import format as fmt
    from sojourn.capsule.capture import capture_namespace

    lines = Lines()
    with _open(repo, lines, create=True) as r:
        failed = _fail_os(monkeypatch, "fsync", errno.EIO, 3)
        m = capture_namespace({"a": np.arange(2_000_000.0)}, r)
        monkeypatch.undo()
        assert failed[0] == 3
        assert fmt.load_manifest(r, m.id).variables[0].name == "a"
    assert any(f"the repository {r.url} is unavailable while writing" in ln and "Input/output error (EIO)" in ln
               and "retrying for up to" in ln for ln in lines), lines
    assert any("answers again" in ln for ln in lines), lines


def test_a_fault_that_lasts_gives_up_at_the_deadline_with_what_to_do(repo: str, monkeypatch: pytest.MonkeyPatch) -> None:
    lines = Lines()
    with _open(repo, lines, budget=30.0, create=True) as r:
        _fail_os(monkeypatch, "fsync", errno.EIO, None)
        t0 = time.monotonic()
        with r.retry_deadline(1.0), pytest.raises(StoreUnavailable, match=r"gave up after 1 s .* while writing chunks/") as info:
            r.backend.save("chunks", "ab" * 32, b"x")
        took = time.monotonic() - t0
    assert 0.9 < took < 5, took  # the caller's deadline, not the 30 s budget
    assert "nothing was lost" in str(info.value) and "Try again once the store is back" in str(info.value)
    assert isinstance(info.value, RepositoryError)


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EACCES, errno.EROFS])
def test_permanent_errors_fail_at_once(repo: str, monkeypatch: pytest.MonkeyPatch, err: int) -> None:
    lines = Lines()
    with _open(repo, lines, budget=30.0, create=True) as r:
        count = _fail_os(monkeypatch, "fsync", err, None)
        t0 = time.monotonic()
        with pytest.raises(RepositoryError) as info:
            r.backend.save("chunks", "cd" * 32, b"x")
    assert time.monotonic() - t0 < 1 and count[0] == 1 and not lines
    assert not isinstance(info.value, StoreUnavailable)
    want = {errno.ENOSPC: "no space left on the device", errno.EACCES: "permission denied",
            errno.EROFS: "permission denied"}[err]
    assert want in str(info.value)


def test_an_exclusive_create_whose_answer_was_lost_is_ours(repo: str, monkeypatch: pytest.MonkeyPatch) -> None:
    lines = Lines()
    with _open(repo, lines, create=True) as r:
        real_link = os.link
        calls = [0]

        def link_then_fail(src: Any, dst: Any, **kw: Any) -> None:
            calls[0] += 1
            real_link(src, dst, **kw)
            if calls[0] == 1:
                raise OSError(errno.EIO, "Input/output error")  # it happened; the answer did not come

        monkeypatch.setattr(os, "link", link_then_fail)
        r.backend.save("workspaces", "event.ws_1.00000001", b"mine", exclusive=True)
        assert calls[0] == 2 and r.backend.load("workspaces", "event.ws_1.00000001") == b"mine"
        calls[0] = 0
        # someone else's object is still someone else's
        with pytest.raises(AlreadyExists):
            r.backend.save("workspaces", "event.ws_1.00000001", b"theirs", exclusive=True)
        monkeypatch.undo()
        real_unlink = os.unlink

        def unlink_then_fail(path: Any, **kw: Any) -> None:
            real_unlink(path, **kw)
            if "event" in str(path):
                raise OSError(errno.EIO, "Input/output error")

        monkeypatch.setattr(os, "unlink", unlink_then_fail)
        monkeypatch.setattr(Path, "unlink", lambda self, missing_ok=False: unlink_then_fail(self))
        r.backend.remove("workspaces", "event.ws_1.00000001")  # removed, its answer lost: done
        monkeypatch.undo()
        assert r.backend.stat("workspaces", "event.ws_1.00000001") is None


# -- local: real filesystems that fill up, turn read-only, disappear ------------------------------


@pytest.fixture
def mounted(tmp_path: Path) -> Iterator[Callable[..., Path]]:
    made: list[Path] = []

    def mount(size: str = "4m", name: str = "mnt") -> Path:
        d = tmp_path / name
        d.mkdir(exist_ok=True)
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(d)], capture_output=True,
                              text=True)
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
        made.append(d)
        return d

    yield mount
    for d in made:
        subprocess.run(["umount", "-l", str(d)], capture_output=True)


@ROOT_ONLY
def test_a_full_disk_fails_the_capture_at_once_and_keeps_the_last_capsule(mounted: Callable[..., Path]) -> None:
    import numpy as np

    from sojourn.capsule import format as fmt
    from sojourn.capsule.capture import capture_namespace
    from sojourn.errors import CaptureError

    repo = mounted("3m") / "repo"
    lines = Lines()
    with _open(str(repo), lines, create=True) as r:
        first = capture_namespace({"small": np.arange(1000.0)}, r)
        t0 = time.monotonic()
        with pytest.raises((RepositoryError, CaptureError), match=r"no space left on the device .*previous capsules are intact"):
            capture_namespace({"big": np.random.default_rng(0).random(1_000_000)}, r)
        assert time.monotonic() - t0 < 10 and not lines  # not retried
        assert fmt.load_manifest(r, first.id).variables[0].name == "small"


@ROOT_ONLY
def test_a_read_only_repository_is_reported_at_once(mounted: Callable[..., Path]) -> None:
    mnt = mounted("4m")
    repo = mnt / "repo"
    lines = Lines()
    with _open(str(repo), lines, create=True) as r:
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        with pytest.raises(RepositoryError, match=r"permission denied .*not writable by this user"):
            r.backend.save("workspaces", "x", b"1")
    assert not lines


@ROOT_ONLY
def test_an_unmounted_repository_is_never_written_into_nor_re_created(mounted: Callable[..., Path]) -> None:
    mnt = mounted("4m")
    repo = mnt / "repo"
    with _open(str(repo), Lines(), create=True) as r:
        r.backend.save("chunks", "ab" * 32, b"before")  # a shard directory it knows exists
        subprocess.run(["umount", str(mnt)], check=True)
        repo.mkdir()  # the empty mount point's path, as a careless script would leave it
        for kind, name in (("chunks", "ab" * 32), ("chunks", "cd" * 32), ("workspaces", "event.ws_1.00000002")):
            with pytest.raises(RepositoryNotFound, match=r"is gone .*config/ directory is missing.*never re-created"):
                r.backend.save(kind, name, b"after")
        with pytest.raises(RepositoryChanged, match=f"the repository {r.id} is gone from"):
            r.check_identity()
        assert list(repo.iterdir()) == []
        with pytest.raises(RepositoryChanged, match=f"the repository {r.id} is gone"):
            open_repository(str(repo), expect_id=r.id)


def test_a_deleted_or_replaced_repository_is_refused(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    lines = Lines()
    r = _open(str(repo), lines, create=True)
    r.backend.save("workspaces", "meta.ws_1", b"{}")
    r.check_identity()
    shutil.rmtree(repo)
    with pytest.raises(RepositoryNotFound, match="is gone"):
        r.backend.save("workspaces", "event.ws_1.00000001", b"{}", exclusive=True)
    assert not repo.exists(), "a write re-created the deleted repository"
    with pytest.raises(RepositoryChanged, match="gone from"):
        r.check_identity()
    with pytest.raises(RepositoryNotFound):
        open_repository(str(repo))  # without create, a vanished repository stays vanished
    other = open_repository(str(repo), create=True)  # someone makes a new one there, on purpose
    with pytest.raises(RepositoryChanged, match=f"now holds {other.id}, not the repository {r.id}"):
        r.check_identity()
    with pytest.raises(RepositoryChanged, match=f"now holds the repository {other.id}, not {r.id}"):
        open_repository(str(repo), expect_id=r.id)
    open_repository(str(repo), expect_id=other.id).close()


# -- S3: an outage and throttling between sojourn and a real server ----------------------------


@pytest.fixture
def proxied(s3_env: S3Server, s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FaultProxy, str]]:
    target = urlparse(s3_env.endpoint)
    proxy = FaultProxy((target.hostname or "127.0.0.1", target.port or 80))
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.start())
    try:
        yield proxy, f"s3://{s3_bucket}/faults-{uuid.uuid4().hex[:10]}"
    finally:
        proxy.stop()


def _later(seconds: float, fn: Callable[[], None]) -> threading.Timer:
    t = threading.Timer(seconds, fn)
    t.start()
    return t


@pytest.mark.s3
def test_s3_unreachable_for_a_while_then_every_write_lands(proxied: tuple[FaultProxy, str]) -> None:
    import numpy as np

    from sojourn.capsule import format as fmt
    from sojourn.capsule.capture import capture_namespace

    proxy, url = proxied
    lines = Lines()
    with _open(url, lines, create=True) as r:
        proxy.mode = "down"
        back = _later(3.0, lambda: setattr(proxy, "mode", "up"))
        t0 = time.monotonic()
        r.backend.save("workspaces", "event.ws_1.00000001", b'{"seq": 1}', exclusive=True)
        m = capture_namespace({"w": np.random.default_rng(2).random(600_000)}, r)
        back.join()
        assert time.monotonic() - t0 >= 2.5 and proxy.dropped > 0
        assert r.backend.load("workspaces", "event.ws_1.00000001") == b'{"seq": 1}'
        assert fmt.load_manifest(r, m.id).variables[0].name == "w"
    assert any(f"the repository {url} is unavailable while writing workspaces/event.ws_1.00000001" in ln
               and "cannot reach" in ln for ln in lines), lines
    assert any("answers again" in ln for ln in lines), lines


@pytest.mark.s3
def test_s3_throttling_and_5xx_are_retried_and_a_long_outage_is_refused_at_the_deadline(
    proxied: tuple[FaultProxy, str],
) -> None:
    proxy, url = proxied
    lines = Lines()
    with _open(url, lines, create=True) as r:
        proxy.mode = "slowdown"
        back = _later(1.5, lambda: setattr(proxy, "mode", "up"))
        r.backend.save("chunks", "ef" * 32, b"data")
        back.join()
        # every 503 was taken as "not now": one of them raised as permanent would have failed the save
        assert proxy.refused > 0 and r.backend.load("chunks", "ef" * 32) == b"data"
        assert len([ln for ln in lines if "is unavailable while writing chunks/" in ln]) == 1, lines
        proxy.mode = "down"
        with r.retry_deadline(1.5), pytest.raises(StoreUnavailable, match="gave up after"):
            r.backend.load("chunks", "ef" * 32)
        proxy.mode = "up"
        with pytest.raises(ObjectNotFound):
            r.backend.load("chunks", "00" * 32)  # a missing object is an answer, not a fault
