"""The destination's lease (docs/moves.md, "Remote destinations"): a destination that dies
mid-move is noticed by its stopped heartbeat within ``L`` seconds, wherever it runs, and the
move aborts with the program carrying on at the source.

The source is run with the test switch ``move.source.as-remote:on``: it then cannot see the
destination's pid (as with a destination on another host), so only the lease can tell it
that the destination died.
"""

from __future__ import annotations

import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sojourn.errors import SojournError
from sojourn.repository.memory import MemoryBackend
from sojourn.repository.repo import open_repository
from sojourn.workspace.migrate import Heartbeat, LeaseWatch, await_verdict, timeout_reason
from sojourn.workspace.store import WorkspaceStore
from tests.workspace.conftest import Shell, finish, kill, wait_for
from tests.workspace.test_move import Mover, holders_alive, mover, moves_of

LEASE = 2.0


@pytest.fixture
def mv(sh: Shell, tmp_path: Path) -> Iterator[Mover]:
    yield from mover(sh, tmp_path)


@pytest.mark.parametrize("point", ["move.dest.after-capsule-seen", "move.dest.after-restore"])
def test_a_destination_killed_mid_move_is_noticed_by_its_lease(mv: Mover, point: str) -> None:
    run, ws = mv.start(fault="move.source.as-remote:on")
    env = {"SOJOURN_FAULT": f"{point}:wait", "SOJOURN_MOVE_LEASE": str(LEASE)}
    # --timeout 300: the size-based bound is far away; only the lease can end the hold soon.
    cli = mv.sh.start("move", ws, "--to", "local", "--timeout", "300", env=env)
    pid = mv.hit(point)  # the source holds the program paused, its capsule written
    held_at = len(mv.steps())
    kill(pid, signal.SIGKILL)
    t0 = time.monotonic()
    code, _, err = finish(cli)
    took = time.monotonic() - t0
    assert code == 1 and "not moved" in err and "stopped renewing its lease" in err, err
    assert took < LEASE + 15, took  # L plus the polls, on a loaded machine; the timeout was 300 s
    rec = mv.record(ws)
    (m,) = moves_of(rec)
    assert m["outcome"] == "aborted" and f"did not change for {LEASE:g} s" in m["reason"], m
    assert rec["state"] == "running" and len(rec["allocations"]) == 1 and rec["epoch"] == 2
    wait_for(lambda: len(mv.steps()) > held_at + 3, 30, "the program to carry on at the source")
    finish(run)
    final = mv.check_final(ws)
    assert [a["stop_reason"] for a in final["allocations"]] == ["finished"]
    wait_for(lambda: not holders_alive(mv.tag), 30, "every process of the test to end")


# -- the lease itself, in one process, on a repository that can fail -------------------------


@pytest.fixture
def store() -> Iterator[WorkspaceStore]:
    name = f"lease-{uuid.uuid4().hex}"
    with open_repository(f"memory://{name}", create=True) as repo:
        yield WorkspaceStore(repo)
    MemoryBackend(name).clear()


def test_the_lease_expires_by_the_readers_clock_only_when_the_counter_stops(store: WorkspaceStore) -> None:
    beat = Heartbeat(store, "ws_1", "mv_1", 0.4)
    beat.start()
    ready = {"lease": 0.4, "machine": "gpu", "host": "elsewhere", "pid": 7}
    watch = LeaseWatch(store, "ws_1", "mv_1")
    t_end = time.monotonic() + 1.5
    while time.monotonic() < t_end:  # renewed every 0.1 s: never expires
        assert watch.expired(ready) is None
        time.sleep(0.02)
    assert beat.fresh()
    beat.stop()
    why = wait_for(lambda: watch.expired(ready), 3, "the lease to expire")
    assert "gpu (elsewhere, supervisor pid 7)" in why and "did not change for 0.4 s" in why
    assert LeaseWatch(store, "ws_1", "mv_1").expired({"host": "elsewhere"}) is None  # no lease published: none judged


def test_a_destination_that_cannot_renew_its_lease_stops_being_fresh(store: WorkspaceStore,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    beat = Heartbeat(store, "ws_1", "mv_1", 0.4)
    beat.start()
    assert beat.fresh()

    def away(*a: object, **k: object) -> None:
        raise SojournError("the repository is out of reach")

    monkeypatch.setattr(store.backend, "save", away)
    wait_for(lambda: not beat.fresh(), 3, "the lease to go stale")  # past L/2 without a write
    beat.stop()


def test_a_remote_timeout_with_a_live_lease_says_the_destination_was_alive() -> None:
    why = timeout_reason({"host": "elsewhere", "pid": 7, "machine": "gpu", "lease": 10}, 130)
    assert "130 s" in why and "renewing its lease" in why and "--timeout" in why


def test_the_source_aborts_on_a_silent_destination_without_waiting_for_the_timeout(store: WorkspaceStore) -> None:
    """await_verdict with a 300 s timeout: the lease (0.4 s) ends the hold, by an abort swap."""
    from sojourn.workspace.migrate import put_marker

    ws, move = "ws_2", "mv_2"
    store.acquire(ws, 0, "al_src")
    beat = Heartbeat(store, ws, move, 0.4)
    beat.start()
    put_marker(store, ws, move, "ready", {"host": "elsewhere", "pid": 7, "machine": "gpu", "lease": 0.4})
    beat.stop()  # it dies here
    t0 = time.monotonic()
    v = await_verdict(store, ws, 1, "al_src", move, "al_dst", timeout=300, capsule=None)
    assert v.outcome == "abort" and v.epoch == 2 and "stopped renewing its lease" in v.why
    assert time.monotonic() - t0 < 5


def test_the_command_gives_up_on_a_destination_that_dies_before_it_asks(store: WorkspaceStore) -> None:
    """`sojourn move` watching a destination it cannot see (a provider on another host says
    "unknown": running): killed after its ready marker, before its request, nothing was
    paused, and the command stops waiting once the lease lapses (it waited 240 s before)."""
    from types import SimpleNamespace

    from sojourn.ops.moves import _wait
    from sojourn.workspace.migrate import put_marker

    ws, move = "ws_3", "mv_3"
    beat = Heartbeat(store, ws, move, 0.4)
    beat.start()
    put_marker(store, ws, move, "ready", {"host": "elsewhere", "pid": 7, "machine": "gpu", "lease": 0.4})
    beat.stop()
    t0 = time.monotonic()
    res = _wait(store, ws, SimpleNamespace(upto=0, epoch=1), move, "al_src", "al_dst", lambda: True, 60.0, None)
    assert not res["moved"] and "stopped renewing its lease" in res["message"], res
    assert "nothing was paused" in res["message"] and time.monotonic() - t0 < 5
