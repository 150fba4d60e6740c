"""Capture's write order (chunks → flush → manifest → flush) and what a second capture writes."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import sojourn
from sojourn.capsule.capture import capture_namespace
from sojourn.repository.backend import Backend
from sojourn.repository.chunks import ChunkStore
from sojourn.repository.memory import MemoryBackend
from sojourn.repository.repo import Repository, open_repository
from tests.conftest import last_json, run_py


class Recording:
    """A backend that logs every write-side call before passing it on."""

    def __init__(self, inner: Backend):
        self.inner = inner
        self.url = inner.url
        self.events: list[tuple[str, str, str]] = []

    def save(self, kind: str, name: str, data: bytes | memoryview, *, exclusive: bool = False) -> None:
        self.inner.save(kind, name, data, exclusive=exclusive)
        self.events.append(("save", kind, name))

    def flush(self) -> None:
        self.inner.flush()
        self.events.append(("flush", "", ""))

    def __getattr__(self, attr: str) -> object:
        return getattr(self.inner, attr)


@pytest.fixture
def recorded() -> Iterator[tuple[Repository, Recording]]:
    url = f"memory://order-{uuid.uuid4().hex}"
    repo = open_repository(url, create=True)
    rec = Recording(repo.backend)
    repo.backend = rec  # type: ignore[assignment]
    repo._chunks = ChunkStore(rec, chunk_size=1 << 20)  # type: ignore[arg-type]  # chunks is a lazy property
    yield repo, rec
    repo.close()
    MemoryBackend(url.removeprefix("memory://")).clear()


def test_chunks_are_durable_before_the_manifest_is_written(recorded: tuple[Repository, Recording]) -> None:
    repo, rec = recorded
    ns = {"a": np.random.default_rng(1).random(400_000), "b": [1, 2, 3]}
    manifest = capture_namespace(ns, repo)
    ev = rec.events
    manifest_at = ev.index(("save", "capsules", manifest.id + ".json"))
    chunk_saves = [i for i, e in enumerate(ev) if e[1] == "chunks"]
    assert len(chunk_saves) >= 4  # 3.2 MB of floats in 1 MiB chunks, plus the stream
    assert max(chunk_saves) < manifest_at
    flushes = [i for i, e in enumerate(ev) if e[0] == "flush"]
    assert any(max(chunk_saves) < f < manifest_at for f in flushes), ev
    assert any(f > manifest_at for f in flushes), ev
    assert [e for e in ev if e[1] == "capsules"] == [("save", "capsules", manifest.id + ".json")]


def test_a_second_capture_of_a_barely_changed_namespace_writes_only_the_changed_chunks(
    recorded: tuple[Repository, Recording],
) -> None:
    repo, rec = recorded
    big = np.random.default_rng(2).random(1_000_000)  # 8 MB: eight 1 MiB chunks
    ns = {"big": big, "small": {"k": "v"}}
    first = capture_namespace(ns, repo)
    rec.events.clear()
    big[700_000] += 1.0  # byte 5_600_000: inside chunk 5
    second = capture_namespace(ns, repo, parent=first.id)
    new_chunks = [e[2] for e in rec.events if e[0] == "save" and e[1] == "chunks"]
    assert len(new_chunks) == 1, new_chunks
    assert second.buffers[0].record.chunks[5] in new_chunks[0]
    assert second.stats["chunks_new"] == 1
    assert second.stats["bytes_written"] == 1 << 20
    assert second.parent == first.id
    # A capture of the unchanged namespace writes no chunk at all, only its manifest.
    rec.events.clear()
    capture_namespace(ns, repo, parent=second.id)
    assert [e for e in rec.events if e[0] == "save" and e[1] == "chunks"] == []


def test_local_dedup_and_restore_in_a_fresh_interpreter(tmp_path: Path, repo: str) -> None:
    big = np.random.default_rng(3).random(1_500_000)
    ns = {"big": big, "names": ["x", "y"]}
    ref1 = sojourn.capture(ns, repo)
    big[10] = 0.5
    ref2 = sojourn.capture(ns, repo, parent=ref1.id)
    assert ref1.bytes_written >= 12_000_000
    assert ref2.bytes_written <= (4 << 20) + 100_000  # one 4 MiB chunk (and maybe the stream)
    chunk_files = [p for p in (Path(repo) / "chunks").rglob("*") if p.is_file()]
    assert not [p for p in chunk_files if p.name.startswith(".tmp")]
    res = run_py(
        """
import sys, json, sojourn
ns = sojourn.restore(sys.argv[2], sys.argv[1])
print(json.dumps({"v": float(ns["big"][10]), "n": len(ns["big"]), "names": ns["names"]}))
""",
        repo,
        ref2.id,
        cwd=tmp_path,
    )
    assert last_json(res) == {"v": 0.5, "n": 1_500_000, "names": ["x", "y"]}
