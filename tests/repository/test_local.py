"""The local backend: the conformance suite, plus its write protocol on disk."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from sojourn.errors import RepositoryError, RepositoryNotFound
from sojourn.repository.local import LocalBackend
from tests.repository.conformance import (
    BackendConformance,
    ChunkStoreConformance,
    NewBackend,
    SealedConformance,
)


class TestLocalBackend(BackendConformance, ChunkStoreConformance):
    @pytest.fixture
    def new_backend(self, tmp_path: Path) -> NewBackend:
        counter = iter(range(1000))
        return lambda: LocalBackend(tmp_path / f"repo{next(counter)}")


class TestLocalSealed(SealedConformance):
    @pytest.fixture
    def new_plain_backend(self, tmp_path: Path) -> NewBackend:
        counter = iter(range(1000))
        return lambda: LocalBackend(tmp_path / f"repo{next(counter)}")


def _fd_path(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to name fsynced files")
def test_write_protocol_is_temp_fsync_rename_then_fsync_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    b = LocalBackend(tmp_path / "repo")
    b.create()
    events: list[tuple[str, ...]] = []
    real_fsync, real_replace, real_link = os.fsync, os.replace, os.link

    def fsync(fd: int) -> None:
        events.append(("fsync", _fd_path(fd)))
        real_fsync(fd)

    def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        events.append(("replace", str(src), str(dst)))
        real_replace(src, dst)

    def link(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        events.append(("link", str(src), str(dst)))
        real_link(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(os, "link", link)

    b.save("chunks", "abcdef", b"data")
    final = str(tmp_path / "repo" / "chunks" / "ab" / "abcdef")
    (fsync_ev, replace_ev) = events
    tmp = fsync_ev[1]
    assert Path(tmp).parent == Path(final).parent and Path(tmp).name.startswith(".tmp-")
    assert replace_ev == ("replace", tmp, final)  # fsynced, then renamed into place
    assert Path(final).read_bytes() == b"data" and not Path(tmp).exists()

    events.clear()
    b.save("capsules", "cap_1.json", b"{}", exclusive=True)
    fsync_ev, link_ev = events
    assert link_ev == ("link", fsync_ev[1], str(tmp_path / "repo" / "capsules" / "cap_1.json"))
    assert not Path(fsync_ev[1]).exists()  # the temporary name is gone after the link

    # Directory entries become durable in flush, deepest directory first.
    events.clear()
    b.flush()
    synced = [e[1] for e in events]
    assert all(e[0] == "fsync" for e in events)
    repo = tmp_path / "repo"
    assert set(synced) == {str(repo / "chunks" / "ab"), str(repo / "chunks"), str(repo / "capsules")}
    assert synced.index(str(repo / "chunks" / "ab")) < synced.index(str(repo / "chunks"))
    events.clear()
    b.flush()
    assert events == []  # nothing new to make durable


def test_chunks_are_sharded_by_their_first_two_characters(tmp_path: Path) -> None:
    b = LocalBackend(tmp_path / "repo")
    b.create()
    b.save("chunks", "beef00", b"x")
    assert (tmp_path / "repo" / "chunks" / "be" / "beef00").read_bytes() == b"x"
    b.save("capsules", "cap_be.json", b"y")
    assert (tmp_path / "repo" / "capsules" / "cap_be.json").read_bytes() == b"y"


def test_a_failed_write_leaves_no_object_and_no_temporary_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    b = LocalBackend(tmp_path / "repo")
    b.create()
    b.save("chunks", "aa00", b"old")
    real_write = os.write
    calls = {"n": 0}

    def write(fd: int, data: bytes | memoryview) -> int:
        calls["n"] += 1
        if calls["n"] > 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, bytes(data)[: len(data) // 2])  # a short write first

    monkeypatch.setattr(os, "write", write)
    for name in ("aa00", "aa01"):
        calls["n"] = 0
        with pytest.raises(RepositoryError, match=r"no space left on the device.*Free some space"):
            b.save("chunks", name, b"new content " * 1000)
    monkeypatch.undo()
    assert b.load("chunks", "aa00") == b"old"
    assert b.stat("chunks", "aa01") is None
    leftovers = [p for p in (tmp_path / "repo").rglob("*") if p.name.startswith(".tmp")]
    assert leftovers == []


def test_list_ignores_temporary_files(tmp_path: Path) -> None:
    b = LocalBackend(tmp_path / "repo")
    b.create()
    b.save("chunks", "cc11", b"x")
    b.save("capsules", "cap_a.json", b"x")
    (tmp_path / "repo" / "chunks" / "cc" / ".tmp-abandoned").write_bytes(b"partial")
    (tmp_path / "repo" / "capsules" / ".tmp-abandoned").write_bytes(b"partial")
    assert list(b.list("chunks")) == ["cc11"]
    assert list(b.list("capsules")) == ["cap_a.json"]


def test_create_needs_an_existing_parent_and_a_directory(tmp_path: Path) -> None:
    with pytest.raises(RepositoryNotFound, match=r"parent directory .* does not exist"):
        LocalBackend(tmp_path / "missing" / "repo").create()
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(RepositoryNotFound, match="is not a directory"):
        LocalBackend(tmp_path / "file").create()
    assert not LocalBackend(tmp_path / "file").exists()


def test_new_repository_records_the_chunk_store_default(tmp_path):
    # repo.py writes the default without importing chunks.py (start-up time); keep them equal.
    from sojourn.repository.chunks import DEFAULT_CHUNK_SIZE
    from sojourn.repository.repo import open_repository

    with open_repository(tmp_path / "r", create=True) as repo:
        assert repo.config["chunk_size"] == DEFAULT_CHUNK_SIZE
        assert repo._chunks is None  # built on first use only
        assert repo.chunks.chunk_size == DEFAULT_CHUNK_SIZE
