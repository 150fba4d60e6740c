"""Workspace records in the repository: the event log, its fold, the summary cache, names,
authority by compare-and-swap, fencing, crash reaping, and `ps` over 1,000 workspaces.

Concurrency is real: threads on every backend, processes on the local one (and the S3 server),
each racing through the backend's exclusive create."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import pytest

from sojourn.repository.repo import open_repository
from sojourn.workspace import records as R
from sojourn.workspace import signing as S
from sojourn.workspace.authority import reap, take
from sojourn.workspace.errors import AuthorityLost, WorkspaceError, WorkspaceNotFound
from sojourn.workspace.liveness import boot_id, hostname, process_start
from sojourn.workspace.sessions import rows
from sojourn.workspace.store import WorkspaceStore
from tests.conftest import SRC


@pytest.fixture(params=["local", "memory", pytest.param("s3", marks=pytest.mark.s3)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[WorkspaceStore]:
    if request.param == "s3":
        url = request.getfixturevalue("ws_s3_url")
    elif request.param == "local":
        url = str(tmp_path / "repo")
    else:
        url = f"memory://ws-{os.getpid()}-{id(tmp_path)}"
    with open_repository(url, create=True) as repo:
        yield WorkspaceStore(repo)
    if request.param == "memory":
        from sojourn.repository.memory import MemoryBackend

        MemoryBackend(url[len("memory://"):]).clear()


def command() -> R.Command:
    return R.Command(script="train.py", argv=["--epochs", "3"], cwd="/work", python=sys.executable)


def new_workspace(store: WorkspaceStore, name: str | None = None) -> tuple[str, str, int]:
    meta = store.create(command(), name, default_name="train")
    ws, al = meta["id"], R.new_id("al")
    store.append(ws, 0, al, {"type": "created", "name": meta["name"], "command": meta["command"]})
    epoch = take(store, R.initial(meta), al, "run")
    alloc = R.Allocation(id=al, provider="local", machine=hostname(), host=hostname(), boot_id=boot_id(),
                         pid=os.getpid(), pid_start=process_start(os.getpid()), python=sys.executable,
                         memory_limit=None, started=R.now(), epoch=epoch)
    store.append(ws, epoch, al, {"type": "allocation", "allocation": asdict(alloc)})
    return ws, al, epoch


def capsule_event(al: str, cap: str = "cap_1") -> dict[str, object]:
    entry = R.CapsuleEntry(id=cap, parent=None, reason="suspend", where="train.py:3 in <module>", size=1234,
                           time=R.now(), allocation=al, verified=True)
    return {"type": "capsule", "capsule": asdict(entry)}


def stopped(al: str, reason: str = "suspended", cap: str | None = "cap_1") -> dict[str, object]:
    return {"type": "stopped", "allocation": al, "reason": reason, "detail": "", "exit_code": 75,
            "state": R.state_after_stop(reason, cap), "capsule": cap}


def test_fold_gives_state_allocations_capsules_and_next_action(store: WorkspaceStore) -> None:
    ws, al, epoch = new_workspace(store)
    rec = store.record(ws)
    assert (rec.state, rec.epoch, rec.holder, rec.name) == ("running", 1, al, "train")
    assert rec.current is not None and rec.current.id == al
    assert rec.next_action.action == "wait"
    store.append(ws, epoch, al, capsule_event(al), stopped(al))
    rec = store.record(ws)
    assert rec.state == "suspended" and rec.stop_reason == "suspended"
    assert rec.last_capsule is not None and rec.last_capsule.id == "cap_1"
    assert rec.allocations[0].ended is not None and rec.allocations[0].capsule_out == "cap_1"
    assert rec.next_action.action == "resume" and rec.next_action.capsule == "cap_1"
    assert [e["type"] for e in store.events(ws)] == ["created", "authority", "allocation", "capsule", "stopped"]
    # The JSON form round-trips (it is what the summary stores).
    assert R.WorkspaceRecord.from_json(json.loads(json.dumps(rec.to_json()))) == rec


def test_state_policy() -> None:
    assert R.state_after_stop("finished", None) == "finished"
    assert R.state_after_stop("suspended", "cap_1") == "suspended"
    assert R.state_after_stop("oom", "cap_1") == "suspended"
    assert R.state_after_stop("oom", None) == "failed"
    assert R.state_after_stop("failed", "cap_1") == "failed"
    assert R.state_after_stop("failed", "cap_1", ran=False) == "suspended"  # a resume that never ran
    with pytest.raises(ValueError):
        R.state_after_stop("exploded", None)


def test_summary_is_a_cache_that_catches_up(store: WorkspaceStore) -> None:
    ws, al, epoch = new_workspace(store)
    store.record(ws)  # writes the summary at the current head
    # Another process appends without refreshing the summary: a reader still sees everything.
    other = WorkspaceStore(store.repo)
    other.append(ws, epoch, al, capsule_event(al), stopped(al))
    assert store.summary_record(ws).state == "suspended"
    assert json.loads(store.backend.load("workspaces", f"summary.{ws}").partition(b"\n")[2])["upto"] == 5
    # A summary that went back in time (an older writer overwrote a newer one) is caught up.
    old = R.initial(store.meta(ws))
    store.save_summary(old)
    assert store.summary_record(ws).state == "suspended"
    assert store.records([ws])[0].upto == 5


def test_names_are_claimed_once_and_resolve(store: WorkspaceStore) -> None:
    ws1, _, _ = new_workspace(store)
    ws2, _, _ = new_workspace(store)
    ws3, _, _ = new_workspace(store, name="exp.1")
    assert [store.meta(w)["name"] for w in (ws1, ws2, ws3)] == ["train", "train-2", "exp.1"]
    with pytest.raises(WorkspaceError, match=f"taken by workspace {ws3}"):
        store.create(command(), "exp.1")
    for bad in ("ws_x", "-x", "a/b", ""):
        with pytest.raises(WorkspaceError, match="invalid workspace name"):
            store.create(command(), bad)
    assert store.resolve(ws2) == ws2
    assert store.resolve("train-2") == ws2
    assert store.resolve(ws3[:9]) == ws3 or len({w[:9] for w in (ws1, ws2, ws3)}) < 3
    assert store.resolve(ws1[3:]) == ws1
    with pytest.raises(WorkspaceNotFound, match="no workspace 'nope'"):
        store.resolve("nope")
    with pytest.raises(WorkspaceNotFound, match="ambiguous"):
        store.resolve("ws_")


def test_epoch_compare_and_swap_one_winner_among_threads(store: WorkspaceStore) -> None:
    ws, _, epoch = new_workspace(store)
    results: list[str] = []
    barrier = threading.Barrier(8)

    def contender(i: int) -> None:
        barrier.wait()
        try:
            store.acquire(ws, epoch, f"al_{i}")
            results.append(f"won {i}")
        except AuthorityLost as e:
            results.append(f"lost to {e.holder}")

    threads = [threading.Thread(target=contender, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [r for r in results if r.startswith("won")]
    assert len(winners) == 1, results
    winner = "al_" + winners[0].split()[1]
    assert results.count(f"lost to {winner}") == 7
    assert store.epoch(ws) == (2, store.epoch(ws, 1)[1])
    assert store.holds(ws, 2) and not store.holds(ws, 1)


def test_stale_writer_is_fenced(store: WorkspaceStore) -> None:
    ws, al, epoch = new_workspace(store)
    store.append(ws, epoch, al, capsule_event(al, "cap_a"), stopped(al))
    rec = store.record(ws)
    new = R.new_id("al")
    assert take(store, rec, new, "resume") == 2
    before = store.record(ws)
    assert before.state == "running"  # taken to run: nobody else may resume it now
    # The old holder did not notice and publishes a capsule and a stop: both are void.
    store.append(ws, 1, al, capsule_event(al, "cap_stale"), stopped(al, "failed", None))
    rec = store.record(ws)
    assert rec.epoch == 2 and rec.holder == new
    assert rec.last_capsule is not None and rec.last_capsule.id == "cap_a"
    assert [c.id for c in rec.capsules] == ["cap_a"]
    before.upto = rec.upto
    assert rec == before  # nothing the stale writer said counts
    # A second taker that read the same old record loses the swap with a clear message.
    with pytest.raises(WorkspaceError, match="is taking workspace"):
        take(store, R.WorkspaceRecord.from_json({**rec.to_json(), "epoch": 1}), "al_late", "resume")


def test_concurrent_appends_from_threads_keep_every_event(store: WorkspaceStore) -> None:
    ws, _, epoch = new_workspace(store)
    stores = [WorkspaceStore(store.repo) for _ in range(4)]  # separate heads, like separate processes
    each = 10 if type(store.backend).__name__ == "S3Backend" else 25  # a lost race costs 45 ms on radosgw

    def writer(i: int) -> None:
        for j in range(each):
            stores[i].append(ws, epoch, f"w{i}", {"type": "note", "message": f"{i}:{j}"})

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    _check_notes(store, ws, writers=4, each=each)


def _check_notes(store: WorkspaceStore, ws: str, writers: int, each: int) -> None:
    events = store.events(ws)
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))  # no holes, no duplicates
    notes = [e["message"] for e in events if e["type"] == "note"]
    assert sorted(notes) == sorted(f"{i}:{j}" for i in range(writers) for j in range(each))
    for i in range(writers):  # each writer's events keep their order
        mine = [int(n.split(":")[1]) for n in notes if n.startswith(f"{i}:")]
        assert mine == sorted(mine)


APPENDER = """
import sys, time
from sojourn.repository.repo import open_repository
from sojourn.workspace.store import WorkspaceStore
url, ws, i, n, start = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
with open_repository(url) as repo:
    store = WorkspaceStore(repo)
    while time.time() < start:
        time.sleep(0.001)
    for j in range(n):
        store.append(ws, 1, f"p{i}", {"type": "note", "message": f"{i}:{j}"})
"""

ACQUIRER = """
import sys, time
from sojourn.repository.repo import open_repository
from sojourn.workspace.errors import AuthorityLost
from sojourn.workspace.store import WorkspaceStore
url, ws, i, start = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
with open_repository(url) as repo:
    store = WorkspaceStore(repo)
    while time.time() < start:
        time.sleep(0.001)
    try:
        store.acquire(ws, 1, "p" + i)
        print("won")
    except AuthorityLost as e:
        print("lost", e.holder)
"""


def _processes(code: str, tmp_path: Path, argvs: list[list[str]]) -> list[str]:
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(code))
    env = dict(os.environ, PYTHONPATH=str(SRC))
    procs = [subprocess.Popen([sys.executable, str(script), *a], env=env, stdout=subprocess.PIPE, text=True)
             for a in argvs]
    outs = []
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0
        outs.append(out.strip())
    return outs


def _race(url: str, tmp_path: Path, ws: str, each: int) -> None:
    start = str(time.time() + 1.5)  # every process is up and waiting when the race starts
    _processes(APPENDER, tmp_path, [[url, ws, str(i), str(each), start] for i in range(4)])
    with open_repository(url) as repo:
        _check_notes(WorkspaceStore(repo), ws, writers=4, each=each)
    outs = _processes(ACQUIRER, tmp_path, [[url, ws, str(i), str(time.time() + 1.5)] for i in range(6)])
    assert outs.count("won") == 1, outs
    winner = "p" + str(outs.index("won"))
    assert sorted(outs) == sorted(["won"] + [f"lost {winner}"] * 5)


def test_processes_race_appends_and_epochs_on_a_local_repository(tmp_path: Path) -> None:
    url = str(tmp_path / "repo")
    with open_repository(url, create=True) as repo:
        ws, _, _ = new_workspace(WorkspaceStore(repo))
    _race(url, tmp_path, ws, 30)


def test_ps_lists_every_workspace(store: WorkspaceStore) -> None:
    made = []
    for i in range(12):  # above the threshold where object stores are read in parallel
        ws, al, epoch = new_workspace(store)
        if i % 2:
            store.append(ws, epoch, al, capsule_event(al), stopped(al))
        made.append(ws)
    listed = {r.id: r for r in rows(store)}
    assert set(listed) == set(made)
    assert [listed[w].state for w in made] == ["running", "suspended"] * 6
    assert listed[made[1]].last_capsule == "cap_1" and listed[made[1]].size == 1234


def test_reap_records_a_dead_holder_once(store: WorkspaceStore) -> None:
    ws, al, epoch = new_workspace(store)
    store.append(ws, epoch, al, capsule_event(al), stopped(al))
    rec = store.record(ws)
    al2 = R.new_id("al")
    epoch2 = take(store, rec, al2, "resume")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)
    alloc = R.Allocation(id=al2, provider="local", machine=hostname(), host=hostname(), boot_id=boot_id(),
                         pid=pid, pid_start=None, python=sys.executable, memory_limit=None, started=R.now(),
                         epoch=epoch2, capsule_in="cap_1", session_pid=pid + 1_000_000)
    store.append(ws, epoch2, al2, {"type": "allocation", "allocation": asdict(alloc)})
    rec = store.record(ws)
    assert rec.state == "running"
    # Several readers notice at once; exactly one records it.
    readers = [WorkspaceStore(store.repo) for _ in range(4)]
    threads = [threading.Thread(target=lambda s=s: reap(s, s.record(ws))) for s in readers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rec = store.record(ws)
    assert rec.state == "failed" and rec.stop_reason == "failed"
    assert "gone" in rec.detail and str(pid) in rec.detail
    assert rec.next_action.action == "resume" and rec.next_action.capsule == "cap_1"
    assert sum(e["type"] == "stopped" and e["allocation"] == al2 for e in store.events(ws)) == 1
    # A live holder (this process) is left alone.
    ws_live, _, _ = new_workspace(store)
    assert reap(store, store.record(ws_live)).state == "running"


def test_ps_over_1000_workspaces_takes_under_a_second(tmp_path: Path) -> None:
    url = str(tmp_path / "repo")
    with open_repository(url, create=True) as repo:
        store = WorkspaceStore(repo)
        ws, al, epoch = new_workspace(store)
        store.append(ws, epoch, al, {"type": "started", "allocation": al, "session_pid": os.getpid(),
                                     "python_version": "3.11.7"}, capsule_event(al), stopped(al))
        store.record(ws)
        live, _, _ = new_workspace(store, name="live")
        store.record(live)
    # Clone the suspended workspace's objects 998 times (fsyncing 7,000 small files would
    # measure the disk, not ps). Every clone is a full, valid workspace.
    # Records are signed and name their workspace, so each clone is signed again with the key
    # (summaries are left out: the first listing folds each clone and writes its summary).
    folder = Path(url) / "workspaces"
    files = sorted(((p.name, p.read_text()) for p in folder.iterdir() if ws in p.name and "summary" not in p.name),
                   key=lambda f: (not f[0].startswith("meta."), not f[0].startswith("event."), f[0]))
    for i in range(998):
        clone = f"ws_{i:012x}"
        link = ""
        for name, text in files:
            doc = json.loads(text.replace(ws, clone))
            if name.startswith("meta."):
                doc = store.key.sign(S.META_DOMAIN, doc)
            elif name.startswith("event."):
                doc = store.key.sign(S.EVENT_DOMAIN, {**doc, "prev": link})
            link = doc.get("mac", link)
            (folder / name.replace(ws, clone).replace("name.train", f"name.train-{i}")).write_text(json.dumps(doc))
        shutil.copy(Path(url) / "locks" / f"epoch.{ws}.000001", Path(url) / "locks" / f"epoch.{clone}.000001")
    with open_repository(url) as repo:
        store = WorkspaceStore(repo)
        best = float("inf")
        for _ in range(2):
            t0 = time.perf_counter()
            listed = rows(store)
            best = min(best, time.perf_counter() - t0)
    assert len(listed) == 1000
    assert {r.state for r in listed} == {"suspended", "running"}
    print(f"ps over 1,000 workspaces: {best:.3f} s")
    assert best <= 1.0, f"ps over 1,000 workspaces took {best:.2f} s"


def _dead_pid() -> int:
    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)


def test_an_epoch_won_by_a_process_that_died_before_publishing_it_is_stepped_over(store: WorkspaceStore) -> None:
    ws, al, epoch = new_workspace(store)
    store.append(ws, epoch, al, capsule_event(al), stopped(al))
    rec = store.record(ws)
    # A live taker is between its swap and its authority event: others must wait for it.
    store.acquire(ws, epoch, "al_busy", host=hostname(), pid=os.getpid(), pid_start=process_start(os.getpid()))
    with pytest.raises(WorkspaceError, match=r"another command \(al_busy on .*\) is taking workspace"):
        take(store, rec, "al_next", "resume")
    # ... and one that died there is stepped over, so the workspace is not stuck forever.
    store.acquire(ws, epoch + 1, "al_dead", host=hostname(), pid=_dead_pid())
    assert take(store, rec, "al_next", "resume") == epoch + 3
    assert store.record(ws).holder == "al_next"


def test_a_taker_that_died_before_starting_anything_leaves_the_workspace_suspended(store: WorkspaceStore) -> None:
    ws, al, epoch = new_workspace(store)
    store.append(ws, epoch, al, capsule_event(al), stopped(al))
    e2 = store.acquire(ws, epoch, "al_doomed")
    store.append(ws, e2, "al_doomed", {"type": "authority", "holder": "al_doomed", "reason": "resume",
                                       "host": hostname(), "pid": _dead_pid()})
    rec = store.record(ws)
    assert rec.state == "running" and rec.current is None
    rec = reap(store, rec)
    assert rec.state == "suspended" and rec.last_capsule is not None and rec.last_capsule.id == "cap_1"
    assert rec.next_action.action == "resume"


def test_a_creator_that_died_before_its_first_epoch_does_not_leave_it_running(store: WorkspaceStore) -> None:
    meta = store.create(command(), "orphan", creator={"host": hostname(), "boot_id": boot_id(), "pid": _dead_pid()})
    rec = store.record(meta["id"])
    assert rec.state == "running" and rec.epoch == 0
    rec = reap(store, rec)
    assert rec.state == "failed" and "gone" in rec.detail and rec.next_action.action == "run-again"


def test_a_reaper_records_the_capsule_a_dead_allocation_left_unrecorded(store: WorkspaceStore) -> None:
    """A supervisor that died in its write check leaves a capsule no event names: the reaper
    finds it by its label (this allocation's, not another's), checks it and records it. This
    one holds a plain namespace, not a paused program, so its check fails: the stop is
    `failed` and says which check failed; the capsule is in the record, unverified."""
    from sojourn.capsule.capture import capture_namespace

    meta = store.create(command(), None, default_name="train")
    ws, al, pid = meta["id"], R.new_id("al"), _dead_pid()
    store.append(ws, 0, al, {"type": "created", "name": meta["name"], "command": meta["command"]})
    epoch = take(store, R.initial(meta), al, "run")
    alloc = R.Allocation(id=al, provider="local", machine=hostname(), host=hostname(), boot_id=boot_id(), pid=pid,
                         pid_start=None, python=sys.executable, memory_limit=None, started=R.now(), epoch=epoch)
    store.append(ws, epoch, al, {"type": "allocation", "allocation": asdict(alloc)},
                 {"type": "started", "allocation": al, "session_pid": pid, "python_version": "3.11"})
    label = {"workspace": ws, "allocation": al, "epoch": epoch}
    other = capture_namespace({"x": 2}, store.repo, labels={"sojourn.workspace": {**label, "allocation": "al_other"}})
    mine = capture_namespace({"x": 1}, store.repo, labels={"sojourn.workspace": label})
    rec = reap(store, store.record(ws))
    assert rec.state == "failed" and rec.stop_reason == "failed"
    assert [c.id for c in rec.capsules] == [mine.id] and not rec.capsules[0].verified
    assert rec.last_capsule is None and other.id not in rec.detail
    assert f"capsule {mine.id}" in rec.detail and "failed its write check" in rec.detail
    assert rec.allocations[-1].ended is not None
