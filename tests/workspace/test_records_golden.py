"""Workspace logs of every records format stay readable (tests/workspace/golden/README.md).

Format 1 (no MAC) is read and flagged: its record is folded as before, but nothing it says
is trusted to run (the interpreter, a capsule another workspace wrote). Format 2 is read and
checked through. Each event of both parses to its typed kind and back to the same JSON."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from sojourn.repository.repo import open_repository
from sojourn.workspace import events as E
from sojourn.workspace.capsules import record_python
from sojourn.workspace.signing import RecordTampered
from sojourn.workspace.store import WorkspaceStore

GOLDEN = Path(__file__).parent / "golden"
KEY = "6465666768696a6b6c6d6e6f707172737475767778797a7b7c7d7e7f80818283"
WS = "ws_000000000001"
CAP = "cap_00000000000000000000000000000001"


@pytest.fixture
def golden(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> WorkspaceStore:
    monkeypatch.setenv("SOJOURN_KEY", KEY)
    url = tmp_path / request.param
    shutil.copytree(GOLDEN / request.param, url)  # the copy: reading writes the summary cache
    for kind in ("capsules", "chunks"):
        (url / kind).mkdir(exist_ok=True)
    return WorkspaceStore(open_repository(str(url)))


def _check_fold(store: WorkspaceStore) -> None:
    rec = store.record(WS)
    assert (rec.name, rec.state, rec.stop_reason, rec.upto, rec.epoch) == ("train", "suspended", "suspended", 9, 1)
    assert rec.last_capsule is not None and rec.last_capsule.id == CAP and rec.last_capsule.verified
    (a,) = rec.allocations
    assert (a.id, a.python, a.session_pid, a.exit_code, a.max_rss) == ("al_0000000000a1", "/usr/bin/python3", 101, 75,
                                                                        52428800)
    assert rec.requirements["packages"] == {"numpy": "2.1.0"} and rec.command.argv == ["train.py", "--epochs", "3"]
    assert rec.next_action.action == "resume"
    for doc in store.events(WS):
        ev = E.parse(doc)
        assert not isinstance(ev, E.Other), doc["type"]
        # The same JSON (an unset optional field may be written as null or left out).
        assert ev.to_json() == {k: v for k, v in doc.items() if (k not in E.ENVELOPE or k == "type") and v is not None}


@pytest.mark.parametrize("golden", ["records-v1"], indirect=True)
def test_format_1_logs_are_read_and_flagged(golden: WorkspaceStore) -> None:
    _check_fold(golden)
    rec = golden.record(WS)
    assert rec.unsigned == 10 and not rec.signed  # the meta and 9 events
    # Its interpreter is never used, even where this host has it.
    assert record_python(rec) == sys.executable
    # A new sojourn appends signed events, chained to the unsigned one before; from then on
    # an unsigned event (a writer without the key) is refused.
    golden.append(WS, 1, "test", E.Note(message="signed"))
    fresh = WorkspaceStore(golden.repo)
    rec = fresh.record(WS)
    assert rec.upto == 10 and rec.signed and rec.unsigned == 10
    path = Path(golden.repo.url) / "workspaces" / f"event.{WS}.00000011"
    path.write_text(json.dumps({"type": "note", "seq": 11, "epoch": 1, "by": "x", "t": 1.0, "message": "planted"}))
    with pytest.raises(RecordTampered, match="carries no MAC although the records before it are signed"):
        WorkspaceStore(golden.repo).record(WS)


@pytest.mark.parametrize("golden", ["records-v2"], indirect=True)
def test_format_2_logs_are_read_and_checked(golden: WorkspaceStore) -> None:
    _check_fold(golden)
    rec = golden.record(WS)
    assert rec.unsigned == 0 and rec.signed
    here = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable
    assert record_python(rec) == here
    # The checked-in summary is read as it is (no event after it).
    assert WorkspaceStore(golden.repo).summary_record(WS).upto == 9
