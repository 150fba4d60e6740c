"""gc against concurrent captures: the repository locks, deterministically and under a race.

The dangerous capture is one that *skips* chunks because they are already stored (they
belong to a capsule gc is about to prune, or to none) and names them in its manifest only at
the end. These tests make exactly that happen while gc runs, on the local, memory and S3
backends, and check that no capsule that exists is ever missing a chunk."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sojourn.capsule import format as fmt
from sojourn.capsule.capture import capture_namespace
from sojourn.repository import locks
from sojourn.repository.memory import MemoryBackend
from sojourn.repository.repo import Repository, open_repository
from sojourn.workspace.gc import collect
from sojourn.workspace.store import WorkspaceStore
from tests.conftest import SRC, run_py


def arrays(k: int) -> np.ndarray:
    return np.random.default_rng(1000 + k).random(600_000)  # 4.8 MB: two chunks


def missing_chunks(repo: Repository) -> list[str]:
    out = []
    for name in list(repo.backend.list("capsules")):
        try:
            m = fmt.load_manifest(repo, name[:-5])
        except Exception:
            continue  # pruned since it was listed
        out += [f"{m.id}:{n}" for n in m.all_chunk_names(repo.chunks) if repo.backend.stat("chunks", n) is None]
    return out


@pytest.fixture
def mem_url() -> Any:
    url = f"memory://gc-{uuid.uuid4().hex}"
    yield url
    MemoryBackend(url.removeprefix("memory://")).clear()


def test_gc_waits_for_a_capture_in_flight_and_keeps_the_chunks_it_reuses(mem_url: str) -> None:
    repo = open_repository(mem_url, create=True)
    x = arrays(0)
    first = capture_namespace({"x": x}, repo)
    repo.backend.remove("capsules", first.id + ".json")  # its chunks are now garbage...
    repo.backend.save("chunks", "ab" + "0" * 62, b"stray")
    done: dict[str, Any] = {}
    with locks.capture_lock(repo.chunks):  # ...that a capture in flight is about to reuse
        gc = threading.Thread(target=lambda: done.update(r=collect(WorkspaceStore(open_repository(mem_url)),
                                                                     wait=30)))
        gc.start()
        time.sleep(0.5)
        assert "r" not in done and repo.backend.stat("chunks", "ab" + "0" * 62) is not None
        second = capture_namespace({"x": x, "y": 1}, repo)  # joins this process's lock
        assert second.stats["chunks_reused"] >= 2 and second.stats["chunks_new"] <= 1
    gc.join(30)
    res = done["r"]
    # Only the stray chunk and the first capsule's own pickle stream went.
    assert res.chunks_deleted == 1 + len(set(first.all_chunk_names()) - set(second.all_chunk_names()))
    assert missing_chunks(repo) == []
    assert np.array_equal(repo.chunks.get(second.buffers[0].record), bytearray(x.tobytes()))


def test_a_capture_waits_for_gc_and_forgets_its_cache_of_existing_chunks(mem_url: str) -> None:
    repo = open_repository(mem_url, create=True)
    x = arrays(1)
    first = capture_namespace({"x": x}, repo)
    # This chunk store now "knows" x's chunks exist. A gc deletes them (its capsule is gone).
    repo.backend.remove("capsules", first.id + ".json")
    other = open_repository(mem_url)
    lock = locks.take_gc_lock(other.backend, wait=5)
    for n in first.all_chunk_names(repo.chunks):
        other.backend.remove("chunks", n)
    out: dict[str, Any] = {}
    t = threading.Thread(target=lambda: out.update(m=capture_namespace({"x": x}, repo)))
    t.start()
    time.sleep(0.5)
    assert "m" not in out and list(repo.backend.list("capsules")) == []  # waiting for gc
    lock.release()
    t.join(30)
    m = out["m"]
    # It wrote the chunks again rather than trusting what it knew before the gc.
    assert m.stats["chunks_new"] >= 2
    assert missing_chunks(repo) == []


def test_gc_refuses_while_another_gc_runs_and_ignores_locks_of_dead_processes(mem_url: str, tmp_path: Path) -> None:
    repo = open_repository(mem_url, create=True)
    held = locks.take_gc_lock(repo.backend, wait=1)
    with pytest.raises(locks.LockBusy, match="another garbage collection"):
        locks.take_gc_lock(repo.backend, wait=1)
    held.release()
    # A capture lock and a gc lock left by processes that died count for nothing.
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)
    doc = {**locks.holder(), "pid": pid, "pid_start": None, "state": "held", "refreshed": time.time(),
           "purpose": "capture"}
    repo.backend.save("locks", "capture.deadbeef", json.dumps(doc).encode())
    n, _ = locks.newest_gc(repo.backend)
    repo.backend.save("locks", f"gc.{n + 1:08d}", json.dumps({**doc, "purpose": "gc"}).encode())
    t0 = time.monotonic()
    capture_namespace({"v": 1}, repo)  # not blocked by the dead gc
    lock = locks.take_gc_lock(repo.backend, wait=1)  # not blocked by the dead capture
    assert time.monotonic() - t0 < 5
    assert repo.backend.stat("locks", "capture.deadbeef") is None  # removed as stale
    lock.release()
    # A live capture makes gc give up after --wait, deleting nothing.
    with locks.capture_lock(repo.chunks), pytest.raises(locks.LockBusy, match="capture"):
        locks.take_gc_lock(repo.backend, wait=0.3)


def _race_in_threads(url: str, seconds: float) -> tuple[int, int, list[str]]:
    """Captures of recurring arrays (so they keep reusing chunks of capsules gc prunes) in one
    thread, `gc --prune-orphans` in a loop in another, each with its own repository object."""
    stop = threading.Event()
    errors: list[str] = []
    counts = {"captures": 0, "gcs": 0}
    values = [arrays(k) for k in range(3)]

    def capturer() -> None:
        repo = open_repository(url)
        r = 0
        while not stop.is_set():
            try:
                m = capture_namespace({"x": values[r % 3], "r": r}, repo)
                counts["captures"] += 1
                with locks.capture_lock(repo.chunks):  # no gc mid-sweep while we look
                    if repo.backend.stat("capsules", m.id + ".json") is not None:
                        gone = [n for n in m.all_chunk_names(repo.chunks) if repo.backend.stat("chunks", n) is None]
                        if gone:
                            errors.append(f"capsule {m.id} lost {gone}")
            except Exception as e:
                errors.append(repr(e))
            r += 1

    def collector() -> None:
        repo = open_repository(url)
        while not stop.is_set():
            try:
                collect(WorkspaceStore(repo), prune_orphans=True, wait=60)
                counts["gcs"] += 1
            except Exception as e:
                errors.append(repr(e))
            time.sleep(0.1)  # back to back, a gc would keep every capture waiting

    threads = [threading.Thread(target=capturer), threading.Thread(target=collector)]
    for t in threads:
        t.start()
    time.sleep(seconds)
    # The race is only shown once both sides ran a few times: under load (a slow S3 server)
    # the window runs on until they have, within a bound.
    until = time.monotonic() + 6 * seconds
    while (counts["captures"] < 3 or counts["gcs"] < 3) and time.monotonic() < until and not errors:
        time.sleep(0.1)
    stop.set()
    for t in threads:
        t.join(120)
    return counts["captures"], counts["gcs"], errors


def test_gc_racing_captures_in_threads_memory(mem_url: str) -> None:
    open_repository(mem_url, create=True)
    captures, gcs, errors = _race_in_threads(mem_url, 4.0)
    assert errors == []
    assert captures >= 5 and gcs >= 3
    assert missing_chunks(open_repository(mem_url)) == []


@pytest.mark.s3
def test_gc_racing_captures_in_threads_s3(ws_s3_url: str) -> None:
    open_repository(ws_s3_url, create=True)
    captures, gcs, errors = _race_in_threads(ws_s3_url, 8.0)
    assert errors == []
    assert captures >= 2 and gcs >= 2
    assert missing_chunks(open_repository(ws_s3_url)) == []


CAPTURER = """
import sys, time, json
import numpy as np
import sojourn
repo, seconds = sys.argv[1], float(sys.argv[2])
values = [np.random.default_rng(1000 + k).random(600_000) for k in range(3)]
t0, r, ids = time.monotonic(), 0, []
while time.monotonic() - t0 < seconds:
    ids.append(sojourn.capture({"x": values[r % 3], "r": r}, repo).id)
    r += 1
print(json.dumps(ids))
"""


def test_gc_racing_captures_in_processes_local(tmp_path: Path) -> None:
    """Two capturing processes and `sojourn gc --prune-orphans` in a loop, on a local
    repository; every capsule that is left restores in a fresh interpreter."""
    repo = str(tmp_path / "repo")
    open_repository(repo, create=True)
    env = dict(os.environ, PYTHONPATH=str(SRC))
    script = tmp_path / "capturer.py"
    script.write_text(CAPTURER)
    procs = [subprocess.Popen([sys.executable, str(script), repo, "6"], stdout=subprocess.PIPE, text=True, env=env)
             for _ in range(2)]
    gcs = 0
    try:
        while any(p.poll() is None for p in procs):
            g = subprocess.run([sys.executable, "-m", "sojourn.cli.main", "gc", "--prune-orphans", "--repo", repo,
                                "--json"], capture_output=True, text=True, env=env, timeout=120)
            assert g.returncode == 0, g.stderr
            gcs += 1
            with open_repository(repo) as r, locks.capture_lock(r.chunks):
                assert missing_chunks(r) == []
    finally:
        outs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs)
    made = [c for out in outs for c in json.loads(out.strip().splitlines()[-1])]
    assert len(made) >= 6 and gcs >= 2
    with open_repository(repo) as r:
        assert missing_chunks(r) == []
        left = [n[:-5] for n in r.backend.list("capsules")]
    for cap in left[-3:]:
        res = run_py("import sys, sojourn; ns = sojourn.restore(sys.argv[2], sys.argv[1]); print(ns['r'])",
                     repo, cap, cwd=tmp_path)
        assert res.stdout.strip().isdigit()
