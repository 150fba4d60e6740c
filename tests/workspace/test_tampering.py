"""An attacker with write access to the repository but without its key (docs/threat-model.md).

Each attack of issue 12 is played with real `sojourn` processes against a real repository,
by editing its objects the way such a writer can (plain JSON files in a local repository),
and each test shows that nothing ran: the planted interpreter would create a file, the
other workspace's program would print. Then the same attacks on the store alone (forged,
replayed, reordered, cut logs) show the message that names what happened.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from sojourn.repository.repo import open_repository
from sojourn.workspace import records as R
from sojourn.workspace.signing import RecordTampered
from sojourn.workspace.store import WorkspaceStore
from tests.workspace.conftest import Shell

SEED = """
for i in range(12):
    print(i, flush=True)
    kill_here(i)
print("done")
"""

OTHER = """
for i in range(6):
    print("other", i, flush=True)
    kill_here(i)
print("other done")
"""


def _events_dir(sh: Shell) -> Path:
    return Path(sh.repo) / "workspaces"


def _events(sh: Shell, ws: str) -> list[tuple[Path, dict[str, Any]]]:
    files = sorted(_events_dir(sh).glob(f"event.{ws}.*"))
    return [(p, json.loads(p.read_text())) for p in files]


def _plant(sh: Shell, ws: str, doc: dict[str, Any]) -> Path:
    """Append an event as a writer without the key can: the next number, plain JSON (with a
    made-up MAC when ``doc`` carries one)."""
    last = _events(sh, ws)[-1][1]
    doc = {**doc, "seq": int(last["seq"]) + 1, "ws": ws, "epoch": last["epoch"], "by": "attacker",
           "t": float(last["t"]) + 1, "prev": last.get("mac")}
    path = _events_dir(sh) / f"event.{ws}.{doc['seq']:08d}"
    path.write_text(json.dumps(doc))
    return path


def _evil_interpreter(sh: Shell) -> tuple[Path, Path]:
    """A script in the repository that would leave a mark, then run Python as asked."""
    mark = sh.dir.parent / "PWNED"
    evil = Path(sh.repo) / "config" / "python3"
    evil.write_text(f"#!/bin/sh\ntouch {mark}\nexec {sys.executable} \"$@\"\n")
    evil.chmod(evil.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return evil, mark


def _paused(sh: Shell, script: str, body: str, kills: str) -> str:
    sh.write(script, body)
    p = sh.cli("run", script, env={"KILLS": kills})
    assert p.returncode == 75, p.stderr
    return sh.show_id(p.stderr)


def test_an_appended_allocation_naming_a_script_does_not_run_it(sh: Shell) -> None:
    """The issue's first attack: two appended events (an allocation whose `python` is a
    script in the repository, and its stop) made a plain `sojourn resume` execute it."""
    ws = _paused(sh, "seed.py", SEED, "4")
    evil, mark = _evil_interpreter(sh)
    alloc = next(doc for _, doc in _events(sh, ws) if doc["type"] == "allocation")
    planted = {**alloc["allocation"], "id": "al_000000000bad", "python": str(evil)}
    first = _plant(sh, ws, {"type": "allocation", "allocation": planted})
    _plant(sh, ws, {"type": "stopped", "allocation": planted["id"], "reason": "suspended", "state": "suspended",
                    "capsule": alloc["allocation"].get("capsule_in"), "exit_code": None, "ran": False})
    p = sh.cli("resume", ws)
    assert p.returncode == 2, p.stderr
    assert f"event {json.loads(first.read_text())['seq']} of workspace {ws} carries no MAC" in p.stderr
    assert "Nothing was run" in p.stderr
    assert p.stdout == "" and not mark.exists()
    # With a made-up MAC the event is a forgery, and is refused as one.
    for path, _ in _events(sh, ws)[-2:]:
        path.unlink()
    _plant(sh, ws, {"type": "allocation", "allocation": planted, "mac": "00" * 32})
    p = sh.cli("resume", ws)
    assert p.returncode == 2 and "fails its MAC" in p.stderr, p.stderr
    assert p.stdout == "" and not mark.exists()
    # The log as the owner wrote it still resumes, with the interpreter it ran with.
    _events(sh, ws)[-1][0].unlink()
    p = sh.cli("resume", ws)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[0] == "5" and not mark.exists()


def test_a_capsule_event_cannot_make_one_workspace_run_anothers_program(sh: Shell) -> None:
    """`sojourn resume B` after one appended `capsule` event naming A's capsule ran A's
    program; a replayed genuine event of A's is refused too, and so is A's capsule named by
    a record with unsigned parts (the manifest's workspace label decides then)."""
    a = _paused(sh, "seed.py", SEED, "4")
    b = _paused(sh, "other.py", OTHER, "2")
    cap_a = sh.show(a)["last_capsule"]
    planted = {**cap_a, "allocation": sh.show(b)["allocations"][-1]["id"]}
    _plant(sh, b, {"type": "capsule", "capsule": planted})
    p = sh.cli("resume", b)
    assert p.returncode == 2 and "carries no MAC" in p.stderr, p.stderr
    assert p.stdout == ""
    _events(sh, b)[-1][0].unlink()
    # A's own signed capsule event, copied into B's log: signed, but A's and numbered for A.
    event_a = next(doc for _, doc in reversed(_events(sh, a)) if doc["type"] == "capsule")
    last_b = _events(sh, b)[-1][1]
    (_events_dir(sh) / f"event.{b}.{last_b['seq'] + 1:08d}").write_text(json.dumps(event_a))
    p = sh.cli("resume", b)
    assert p.returncode == 2 and "replayed under another name" in p.stderr, p.stderr
    assert p.stdout == ""
    _events(sh, b)[-1][0].unlink()
    assert sh.cli("resume", b).stdout.splitlines()[0] == "other 3"  # B's own log resumes B


def test_a_workspace_cannot_be_rolled_back_to_an_older_capsule(sh: Shell) -> None:
    ws = _paused(sh, "seed.py", SEED, "3,7")
    p = sh.cli("resume", ws, env={"KILLS": "3,7"})
    assert p.returncode == 75, p.stderr
    rec = sh.show(ws)
    older, newest = rec["capsules"][0], rec["capsules"][1]
    assert rec["last_capsule"]["id"] == newest["id"]
    # An appended event naming the older capsule...
    _plant(sh, ws, {"type": "capsule", "capsule": older})
    p = sh.cli("resume", ws)
    assert p.returncode == 2 and "carries no MAC" in p.stderr and p.stdout == "", p.stderr
    _events(sh, ws)[-1][0].unlink()
    # ...or the genuine event that recorded it, replayed at the end of the log...
    old_event = next(doc for _, doc in _events(sh, ws) if doc["type"] == "capsule")
    path = _events_dir(sh) / f"event.{ws}.{_events(sh, ws)[-1][1]['seq'] + 1:08d}"
    path.write_text(json.dumps(old_event))
    p = sh.cli("resume", ws)
    assert p.returncode == 2 and "replayed under another name" in p.stderr and p.stdout == "", p.stderr
    path.unlink()
    # ...or the newest events removed, with the signed summary still saying they were there.
    events = _events(sh, ws)
    for path, _ in events[-3:]:
        path.unlink()
    p = sh.cli("resume", ws)
    assert p.returncode == 2 and "a rollback" in p.stderr and p.stdout == "", p.stderr
    for path, doc in events[-3:]:
        path.write_text(json.dumps(doc))
    p = sh.cli("resume", ws)
    assert p.returncode == 0 and p.stdout.splitlines()[0] == "8", p.stderr


def test_an_unsigned_machines_config_names_no_interpreter_that_runs(sh: Shell) -> None:
    """`config/machines.toml` names interpreters: one the attacker wrote (no signature) is
    not run, and `sojourn machines set` does not sign it for them."""
    sh.write("seed.py", SEED)
    assert sh.cli("machines", "set", "small", "--memory", "2GiB").returncode == 0  # a signed config
    evil, mark = _evil_interpreter(sh)
    config = Path(sh.repo) / "config" / "machines.toml"
    assert "sojourn-signature: v1" in config.read_text()
    config.write_text(f'[machines.gpu]\npython = "{evil}"\nprice_per_hour = 1.0\n')
    listing = sh.cli("machines")  # listing a machine asks its interpreter for its version
    assert listing.returncode == 0 and "not signed" in listing.stdout + listing.stderr, listing.stderr
    assert not mark.exists()
    p = sh.cli("run", "--on", "gpu", "seed.py")
    assert p.returncode == 2, p.stderr
    assert "not signed with the repository key" in p.stderr and "it was not run" in p.stderr
    assert not mark.exists()
    p = sh.cli("machines", "set", "small", "--cpus", "1")
    assert p.returncode == 0, p.stderr
    assert "python" not in config.read_text().split("[machines.gpu]")[1].split("[")[0]
    assert not mark.exists()


# -- the store alone: what each tampered log says ------------------------------------------------


@pytest.fixture
def logged(tmp_path: Path) -> tuple[WorkspaceStore, str, Path]:
    repo = open_repository(str(tmp_path / "repo"), create=True)
    store = WorkspaceStore(repo)
    meta = store.create(R.Command("s.py", [], str(tmp_path), sys.executable))
    ws = meta["id"]
    store.append(ws, 0, "test", *({"type": "note", "message": f"n{i}"} for i in range(5)))
    return store, ws, tmp_path / "repo" / "workspaces"


def _fresh(store: WorkspaceStore) -> WorkspaceStore:
    return WorkspaceStore(store.repo)  # no cached links: reads as another process would


def test_a_reordered_log_is_refused(logged: tuple[WorkspaceStore, str, Path]) -> None:
    store, ws, folder = logged
    two, three = folder / f"event.{ws}.00000002", folder / f"event.{ws}.00000003"
    a, b = two.read_bytes(), three.read_bytes()
    two.write_bytes(b)
    three.write_bytes(a)
    with pytest.raises(RecordTampered, match=f"event 2 of workspace {ws} is event 3 of workspace"):
        _fresh(store).record(ws)


def test_an_event_removed_from_the_middle_is_refused(logged: tuple[WorkspaceStore, str, Path]) -> None:
    store, ws, folder = logged
    (folder / f"event.{ws}.00000003").unlink()
    with pytest.raises(RecordTampered, match=f"event 3 of workspace {ws} is missing while event 4 is there"):
        _fresh(store).record(ws)
    with pytest.raises(RecordTampered, match="cut in the middle"):
        _fresh(store).append(ws, 0, "test", {"type": "note", "message": "after"})


def test_an_edited_event_fails_its_mac(logged: tuple[WorkspaceStore, str, Path]) -> None:
    store, ws, folder = logged
    four = json.loads((folder / f"event.{ws}.00000004").read_text())
    four["message"] = "edited"
    (folder / f"event.{ws}.00000004").write_text(json.dumps(four))
    with pytest.raises(RecordTampered, match=f"event 4 of workspace {ws} fails its MAC"):
        _fresh(store).record(ws)


def test_a_workspace_copied_under_another_id_is_refused(logged: tuple[WorkspaceStore, str, Path]) -> None:
    store, ws, folder = logged
    clone = "ws_0123456789ab"
    for p in folder.glob(f"*.{ws}*"):
        (folder / p.name.replace(ws, clone)).write_bytes(p.read_bytes())
    with pytest.raises(RecordTampered, match=f"the meta object of workspace {clone} names"):
        _fresh(store).record(clone)


def test_a_summary_without_the_key_is_ignored(logged: tuple[WorkspaceStore, str, Path]) -> None:
    store, ws, folder = logged
    rec = store.record(ws)
    assert rec.upto == 5 and rec.signed and rec.unsigned == 0
    forged = rec.to_json()
    forged["state"] = "suspended"
    forged["last_capsule"] = {"id": "cap_evil", "parent": None, "reason": "x", "where": "x", "size": 0, "time": 0.0,
                              "allocation": "al_x", "verified": True, "error": None}
    body = json.dumps({"format": R.RECORD_FORMAT, "ws": ws, "upto": 5, "head": rec.head, "record": forged}).encode()
    (folder / f"summary.{ws}").write_bytes(b"00" * 32 + b"\n" + body)
    again = _fresh(store).summary_record(ws)
    assert again.last_capsule is None and again.state == "running" and again.upto == 5
    assert os.path.exists(folder / f"summary.{ws}")
