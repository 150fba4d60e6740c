"""The move protocol under faults: every process killed at every step, a corrupt chunk, a
repository that goes away, a full disk, and concurrent resumes (docs/moves.md).

For every case: afterwards at most one copy of the program runs and the record names it (or
the workspace is cleanly stopped on a good capsule); carried on to its end, the program's
output equals an unmoved run and no step's effect is in the file twice; the record tells
what happened.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.workspace.conftest import Shell, finish, kill, settled_record, wait_for
from tests.workspace.test_move import Mover, holders_alive, mover, moves_of


@pytest.fixture
def mv(sh: Shell, tmp_path: Path) -> Iterator[Mover]:
    yield from mover(sh, tmp_path)


def sessions_alive(tag: str) -> list[int]:
    out = []
    for pid in holders_alive(tag):
        try:
            if b"sojourn.workspace.session" in Path(f"/proc/{pid}/cmdline").read_bytes():
                out.append(pid)
        except OSError:
            pass
    return out


def settled(mv: Mover, ws: str, timeout: float = 90) -> dict[str, Any]:
    """Wait until the move is over: one session runs and the record names it as the
    holder's, or none runs and the record is not `running` (a reaper may need to notice)."""

    def check() -> dict[str, Any] | None:
        # `show` reaps a holder whose processes are gone
        return settled_record(mv.record(ws), sessions_alive(mv.tag))

    return dict(wait_for(check, timeout, f"the move of {ws} to settle"))


def outcome_of(rec: dict[str, Any]) -> str:
    ms = moves_of(rec)
    return str(ms[-1]["outcome"]) if ms else "none"


RUN_FAULTS = [
    # (fault in `sojourn run`'s processes: the source supervisor and session)
    "move.source.after-request:kill",
    "move.source.after-capsule:kill",
    "move.source.after-marker:kill",
    "move.source.after-commit-seen:kill",
    "move.source.before-record:kill",
    "move.session.held:kill",
    "move.session.before-exit:kill",
]
MOVE_FAULTS = [
    # (fault in `sojourn move`'s processes: the command, the destination supervisor and session)
    ("move.cli.before-launch:kill", "stayed"),
    ("move.cli.after-launch:kill", "any"),
    ("move.cli.after-request:kill", "any"),
    ("move.cli.after-commit:kill", "moved"),
    ("move.dest.start:kill", "stayed"),
    ("move.dest.after-ready:kill", "stayed"),
    ("move.dest.after-request:kill", "stayed"),
    ("move.dest.after-capsule-seen:kill", "stayed"),
    ("move.dest.after-restore:kill", "stayed"),
    ("move.dest.after-cas:kill", "any"),
    ("move.dest.after-events:kill", "any"),
    ("move.dest.after-go:kill", "any"),
    ("move.incoming.before-restore:kill", "stayed"),
    ("move.incoming.after-restore:kill", "stayed"),
]


@pytest.mark.parametrize("fault", RUN_FAULTS)
def test_source_killed_at_each_step(mv: Mover, fault: str) -> None:
    run, ws = mv.start(fault=fault)
    res = mv.move(ws)
    rec = settled(mv, ws)
    assert rec["epoch"] >= 1
    finish(run)
    final = mv.check_final(ws)
    shown = mv.sh.cli("show", ws)
    assert shown.returncode == 0 and "move" in shown.stdout
    assert moves_of(final) or any(e["type"] == "request" and e.get("move") for e in final["events"]), res.stderr


@pytest.mark.parametrize(("fault", "expect"), MOVE_FAULTS)
def test_destination_or_command_killed_at_each_step(mv: Mover, fault: str, expect: str) -> None:
    run, ws = mv.start()
    res = mv.move(ws, "local", fault)
    rec = settled(mv, ws)
    out = outcome_of(mv.record(ws))
    if expect == "stayed":
        assert rec["state"] == "running" and len(rec["allocations"]) == 1, rec["allocations"]
        assert out in ("aborted", "none"), out
        if ":kill" in fault and "cli" not in fault:
            assert res.returncode == 1 and "not moved" in res.stderr, res.stderr
    elif expect == "moved":
        assert out == "moved" and len(rec["allocations"]) == 2
    final = mv.check_final(ws)
    if expect == "stayed":
        assert [a["stop_reason"] for a in final["allocations"]] == ["finished"]
    finish(run)


def test_the_session_killed_before_it_reports_its_capsule(mv: Mover) -> None:
    """Killed between writing the move's capsule and telling anyone: like any crash of a
    session, the program is gone; the move is refused and the workspace failed, with
    nothing left running."""
    run, ws = mv.start(fault="move.session.after-capsule:kill")
    res = mv.move(ws)
    assert res.returncode == 1 and "not moved" in res.stderr, res.stderr
    rec = mv.wait_end(ws)
    assert rec["state"] == "failed" and "SIGKILL" in rec["allocations"][0]["detail"]
    assert outcome_of(rec) == "refused"
    finish(run)
    wait_for(lambda: not holders_alive(mv.tag), 30, "every process to end")


def test_abort_then_the_source_killed(mv: Mover) -> None:
    """The destination dies, the source takes the next epoch back, and dies right then: its
    session settles on its own (suspended on the move's capsule)."""
    run, ws = mv.start(fault="move.source.after-abort:kill")
    res = mv.move(ws, "local", "move.dest.after-restore:kill")
    assert res.returncode != 0
    rec = mv.wait_end(ws)  # its session checks the capsule, records it, and ends
    assert rec["state"] == "suspended" and rec["epoch"] == 2, rec["detail"]
    assert rec["last_capsule"]["reason"] == "move" and outcome_of(rec) == "aborted"
    finish(run)
    mv.check_final(ws)


@pytest.mark.parametrize("who", ["source-supervisor", "source-session", "destination", "destination-session",
                                 "command"])
def test_kill_minus_9_from_outside(mv: Mover, who: str) -> None:
    """A real `kill -9` of one process, sent from outside while it waits at a protocol step."""
    points = {"source-supervisor": ("run", "move.source.after-marker"),
              "source-session": ("run", "move.session.held"),
              "destination": ("move", "move.dest.after-restore"),
              "destination-session": ("move", "move.incoming.after-restore"),
              "command": ("move", "move.cli.after-launch")}
    side, point = points[who]
    run, ws = mv.start(fault=f"{point}:wait" if side == "run" else None)
    env = dict(mv.sh.env, SOJOURN_FAULT=f"{point}:wait") if side == "move" else mv.sh.env
    cli = subprocess.Popen(mv.sh.cmd("move", ws, "--to", "local"), cwd=mv.sh.dir, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    mv.sh.procs.append(cli)
    pid = mv.hit(point)
    kill(pid, signal.SIGKILL)
    mv.go(point)  # let the others on (the killed one never reads it)
    cli.communicate(timeout=180)
    settled(mv, ws)
    finish(run)
    final = mv.check_final(ws)
    assert moves_of(final) or final["allocations"][0]["stop_reason"] != "finished"


def test_a_corrupt_chunk_is_refused_by_the_destination(mv: Mover) -> None:
    """A chunk of the move's capsule damaged between the write and the restore: the
    destination's restore refuses it, the source carries on."""
    run, ws = mv.start(fault="move.source.after-capsule:wait")
    cli = mv.sh.start("move", ws, "--to", "local")
    mv.hit("move.source.after-capsule")
    damaged = 0
    for chunk in (Path(mv.sh.repo) / "chunks").rglob("*"):
        if chunk.is_file() and not chunk.name.startswith("."):
            data = bytearray(chunk.read_bytes())
            data[len(data) // 2] ^= 0xFF
            chunk.write_bytes(bytes(data))
            damaged += 1
    assert damaged
    mv.go("move.source.after-capsule")
    code, _, err = finish(cli)
    assert code == 1 and "not moved" in err, err
    rec = settled(mv, ws)
    assert rec["state"] == "running" and len(rec["allocations"]) == 1
    (m,) = moves_of(rec)
    assert m["outcome"] == "aborted" and "destination refused" in m["reason"]
    cap = rec["capsules"][-1]
    assert not cap["verified"] and "aborted" in cap["error"]
    final = mv.check_final(ws)
    assert [a["stop_reason"] for a in final["allocations"]] == ["finished"]
    finish(run)


def _no_override() -> list[str]:
    """argv prefix that runs a process as root without CAP_DAC_OVERRIDE (so that a mode of
    000 shuts it out), or [] when not root."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("needs setpriv(1) to drop root's permission-override capabilities")
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]


def test_the_repository_goes_away_during_the_move(mv: Mover) -> None:
    """The repository is unreachable (mode 000 to the move's processes) right after the
    capsule was written, for a second and a half: nothing runs on meanwhile, and once it
    is back the move settles one way or the other, once."""
    prefix = _no_override()
    repo = Path(mv.sh.repo)
    env = dict(mv.sh.env, SOJOURN_FAULT="move.source.after-capsule:wait")
    run = subprocess.Popen([*prefix, *mv.sh.cmd("run", "count.py", str(mv.n))], cwd=mv.sh.dir, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    mv.sh.procs.append(run)
    ws = mv.sh.workspace_of(run)
    wait_for(lambda: len(mv.steps()) >= 5, 30, "the program to run")
    cli = subprocess.Popen([*prefix, *mv.sh.cmd("move", ws, "--to", "local")], cwd=mv.sh.dir, env=mv.sh.env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    mv.sh.procs.append(cli)
    mv.hit("move.source.after-capsule")
    mode = repo.stat().st_mode
    repo.chmod(0)
    try:
        probe = subprocess.run([*prefix, sys.executable, "-c", f"import os; os.listdir({str(repo)!r})"],
                               capture_output=True)
        if probe.returncode == 0:
            pytest.skip("a mode of 000 does not shut this user out here")
        mv.go("move.source.after-capsule")
        time.sleep(1.5)
        held = len(mv.steps())
        time.sleep(0.3)
        assert len(mv.steps()) == held  # paused while the repository is away
    finally:
        repo.chmod(mode)
    cli.communicate(timeout=180)
    settled(mv, ws)
    final = mv.check_final(ws)
    assert outcome_of(final) in ("moved", "aborted"), [e["type"] for e in final["events"]]
    finish(run)


DISK_FULL = """
set -e
mount -t tmpfs -o size=$SIZE sojourn-full "$MNT"
exec "$@"
"""


def test_a_full_disk_refuses_the_move_and_the_program_goes_on(mv: Mover, tmp_path: Path) -> None:
    """The repository on a 600 KiB file system: the move's capsule (1 MiB of state that does
    not compress) does not fit; the pause is refused and the program goes on."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1) to mount a small file system")
    mnt = tmp_path / "small"
    mnt.mkdir()
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                            f"mount -t tmpfs -o size=1m probe '{mnt}'"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {probe.stderr.strip()}")
    repo = mnt / "repo"
    driver = tmp_path / "driver.sh"
    driver.write_text(f"""
mount -t tmpfs -o size=600k sojourn-full '{mnt}'
{sys.executable} -m sojourn.cli.main run count.py {mv.n} > run.out 2> run.err &
RUN=$!
until grep -q 'workspace ws_' run.err 2>/dev/null; do sleep 0.05; done
WS=$(grep -o 'ws_[0-9a-f]*' run.err | head -1)
sleep 0.5
{sys.executable} -m sojourn.cli.main move $WS --to local > move.out 2> move.err
echo $? > move.rc
wait $RUN
echo $? > run.rc
{sys.executable} -m sojourn.cli.main show $WS --json > show.json
df -k '{mnt}' > df.txt
""")
    env = dict(mv.sh.env, SOJOURN_REPO=str(repo))
    p = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", str(driver)], cwd=mv.sh.dir, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    d = mv.sh.dir
    import json

    move_err = (d / "move.err").read_text()
    assert (d / "move.rc").read_text().strip() == "1" and "not moved" in move_err, move_err
    assert "No space left" in move_err or "space" in move_err.lower(), move_err
    assert (d / "run.rc").read_text().strip() == "0"
    assert (d / "run.out").read_text() == mv.expected
    assert mv.steps() == list(range(mv.n))
    rec = json.loads((d / "show.json").read_text())
    assert rec["state"] == "finished" and outcome_of(rec) == "refused"
    wait_for(lambda: not holders_alive(mv.tag), 30, "every process to end")


def test_eight_concurrent_resumes_run_the_workspace_once(mv: Mover) -> None:
    run, ws = mv.start()
    assert mv.sh.cli("suspend", ws).returncode == 0
    finish(run)
    procs = [mv.sh.start("resume", ws) for _ in range(8)]
    results = [finish(p, timeout=180) for p in procs]
    winners = [r for r in results if r[0] == 0]
    assert len(winners) == 1, [(r[0], r[2][-300:]) for r in results]
    for code, out, err in results:
        if code != 0:
            assert code == 2 and out == "", err
    rec = mv.check_final(ws)
    assert len(rec["allocations"]) == 2 and rec["epoch"] == 2
