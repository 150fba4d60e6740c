"""A randomized fault campaign over live moves, suspends and resumes (issue 4; docs/moves.md).

Each trial is a workspace running a small script that appends ``<step> <pid>`` to a file and
prints the step; one random operation (a live move, a move forced to abort, a suspend then a
resume, concurrent resumes) with one or two random faults: a ``SOJOURN_FAULT`` point chosen
among every ``fault("...")`` call in ``src/sojourn`` for the processes involved (``kill`` or
``exit``), a real ``kill -9`` from outside of a random process (at a fault point, or after a
random delay), or a corrupt chunk. Then recovery as a user would do it (``sojourn resume``
from the last good capsule while the workspace is suspended or failed; a new ``sojourn run``
only when it failed with no capsule at all) until the script finished. Then the invariants:

* settled after the operation: one live session and the record names it, or none and the
  record is not ``running``;
* the steps file: every step once, in order, each allocation's steps contiguous and run by
  the session the record names, each allocation starting exactly where the capsule it
  resumed from stopped, that capsule being the last verified one; a statement runs again
  only after a session was killed while it ran (then from its last good capsule);
* ``sojourn logs`` equals the steps' output (an unmoved run), except the output a killed
  supervisor had read but not logged (docs/workspaces.md, Crashes);
* ``sojourn show`` names every stop reason and every move outcome;
* no process of the trial is left.

Trials run several at a time, each with its own repository and SOJOURN_HOME.
``SOJOURN_CAMPAIGN_SEED`` replays a campaign, ``SOJOURN_CAMPAIGN_TRIALS`` sizes it (default:
until 200 fault points fired), ``SOJOURN_CAMPAIGN_ONLY=7,12`` runs those trials only,
``SOJOURN_CAMPAIGN_JOBS`` sets how many run at once. The tally (fault x outcome) is printed.
"""

from __future__ import annotations

import difflib
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import SRC
from tests.workspace.test_move import holders_alive

SCRIPT = """
import os, random, sys, time
n, gate = int(sys.argv[1]), int(sys.argv[2])
blob = random.Random(0).randbytes(64 << 10)  # state that does not compress: chunks to damage
total = 0
for i in range(n):
    while i >= gate and not os.path.exists("open"):  # the harness opens it once the faults are over
        time.sleep(0.01)
    total += i
    with open("steps.txt", "a") as f:
        f.write(f"{i} {os.getpid()}\\n")
    print(i, total, flush=True)
    time.sleep(0.02)
print("done", total, len(blob))
"""
STEPS = 70
CAMPAIGN_KEY = uuid.uuid4().hex + uuid.uuid4().hex
KILL_TARGET = 200
MAX_TRIALS = 360


def all_points() -> list[str]:
    """Every fault point the code has (so that a new one is in the campaign at once)."""
    found = set()
    for path in (SRC / "sojourn").rglob("*.py"):
        found.update(re.findall(r"""\bfault\(["']([a-z][a-z0-9.\-]+)["']\)""", path.read_text()))
    return sorted(found)


POINTS = all_points()
# Which command's processes a point fires in: `sojourn run` (the source supervisor, its session,
# and the abort, which either runs) or `sojourn move` (the command, the destination and its session).
RUN_SIDE = [p for p in POINTS if p.startswith(("move.source.", "move.session.", "move.abort."))]
MOVE_SIDE = [p for p in POINTS if p.startswith(("move.cli.", "move.dest.", "move.incoming."))]
# Destination failures before its swap: the move must abort.
ABORTING = [p for p in MOVE_SIDE if p in ("move.dest.after-capsule-seen", "move.dest.after-restore",
                                          "move.incoming.before-restore", "move.incoming.after-restore")]
# A session that dies here has not reported its capsule: the program is lost since the last good one.
SESSION_CRASH_POINTS = {"move.session.after-capsule"}


def roles(tag: str) -> dict[int, str]:
    """The trial's live processes by role."""
    out = {}
    for pid in holders_alive(tag):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [a.decode(errors="replace") for a in argv]
        if "sojourn.cli.main" in words:
            verb = words[words.index("sojourn.cli.main") + 1] if len(words) > words.index("sojourn.cli.main") + 1 else ""
            if verb in ("run", "resume", "move", "suspend"):
                out[pid] = f"{verb}-cli"
        elif "sojourn.workspace.migrate" in words:
            out[pid] = "dest-supervisor"
        elif "sojourn.workspace.session" in words:
            out[pid] = "dest-session" if "incoming" in words else "session"
        elif "sojourn.execution" in words and "check" in words:
            out[pid] = "write-check"
    return out


@dataclass
class Fault:
    label: str  # the tally's row
    fired: bool = False
    point: bool = False  # a `point:kill|exit` fault: fired when its .hit file is there


@dataclass
class Trial:
    index: int
    seed: int
    op: str = ""
    faults: list[Fault] = field(default_factory=list)
    outcome: str = "none"
    recovered: list[str] = field(default_factory=list)  # states resumed from
    replays: int = 0
    crash_budget: int = 0  # sessions killed while the program ran (a statement may then run again)
    killed_supervisors: set[str] = field(default_factory=set)  # allocations whose supervisor died
    violations: list[str] = field(default_factory=list)
    known: list[str] = field(default_factory=list)  # open bugs with a failing test of their own below
    seconds: float = 0.0


class Bench:
    """One trial's scratch directory, repository, SOJOURN_HOME and tagged processes."""

    def __init__(self, root: Path, trial: Trial):
        self.t = trial
        self.dir = root / "work"
        self.dir.mkdir(parents=True)
        self.faults = root / "faults"
        self.faults.mkdir()
        self.root = root
        self.tag = uuid.uuid4().hex
        env = dict(os.environ)
        env["PYTHONPATH"] = str(SRC) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env.update(SOJOURN_CACHE=str(root / "cache"), SOJOURN_REPO=str(root / "repo"), SOJOURN_HOME=str(root / "home"),
                   SOJOURN_FAULT_DIR=str(self.faults), SOJOURN_TEST_TAG=self.tag, SOJOURN_NOTICES="none",
                   COLUMNS="200")
        env["SOJOURN_KEY"] = CAMPAIGN_KEY  # one key for every trial's repository: `show` runs in this process
        env.pop("SOJOURN_FAULT", None)
        env.pop("KILLS", None)
        self.env = env
        (self.dir / "count.py").write_text(SCRIPT)
        self.procs: list[tuple[subprocess.Popen[bytes], str, Path]] = []  # (process, verb, output file)
        self.workspaces: list[str] = []
        self.gate = random.Random(f"{trial.seed}:{trial.index}:gate").randint(12, 50)

    def cmd(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "sojourn.cli.main", *args]

    def cli(self, *args: str, fault: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        env = dict(self.env, SOJOURN_FAULT=fault) if fault else self.env
        return subprocess.run(self.cmd(*args), cwd=self.dir, env=env, capture_output=True, text=True, timeout=timeout)

    def start(self, *args: str, fault: str | None = None) -> subprocess.Popen[bytes]:
        env = dict(self.env, SOJOURN_FAULT=fault) if fault else self.env
        out = self.root / f"{len(self.procs)}-{args[0]}"
        with open(f"{out}.out", "wb") as o, open(f"{out}.err", "wb") as e:
            p = subprocess.Popen(self.cmd(*args), cwd=self.dir, env=env, stdout=o, stderr=e,
                                 stdin=subprocess.DEVNULL)
        self.procs.append((p, args[0], out))
        return p

    def terminal(self, p: subprocess.Popen[bytes]) -> str:
        for q, _, out in self.procs:
            if q is p:
                return Path(f"{out}.out").read_text(errors="replace")
        return ""

    def stderr(self, p: subprocess.Popen[bytes]) -> str:
        for q, _, out in self.procs:
            if q is p:
                return Path(f"{out}.err").read_text(errors="replace")
        return ""

    def show(self, ws: str) -> dict[str, Any]:
        """`sojourn show --json`, in this process (a poll every 0.1 s in a process of its own
        would cost a CPU per trial); it reaps a holder whose processes are gone, as the
        command does."""
        from sojourn import ops

        return dict(json.loads(json.dumps(ops.show(ws, repo=self.env["SOJOURN_REPO"]).to_json())))

    def steps(self) -> list[tuple[int, int]]:
        path = self.dir / "steps.txt"
        if not path.exists():
            return []
        out = []
        for line in path.read_text().splitlines():
            i, pid = line.split()
            out.append((int(i), int(pid)))
        return out

    def wait(self, pred: Any, timeout: float, what: str, poll: float = 0.03) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            v = pred()
            if v:
                return v
            time.sleep(poll)
        raise TrialError(f"timed out after {timeout:.0f} s waiting for {what}")

    def run(self, fault: str | None = None) -> tuple[subprocess.Popen[bytes], str]:
        p = self.start("run", "count.py", str(STEPS), str(self.gate), fault=fault)
        errf = Path(f"{self.procs[-1][2]}.err")

        def named() -> str | None:
            m = re.search(r"workspace (ws_[0-9a-f]+)", errf.read_text(errors="replace"))
            if m:
                return m.group(1)
            if p.poll() is not None:
                raise TrialError(f"`sojourn run` ended ({p.returncode}) before naming its workspace: "
                                 f"{errf.read_text()[-500:]}")
            return None

        ws = self.wait(named, 60, "the run to name its workspace")
        self.workspaces.append(ws)
        return p, ws

    def progressed(self, k: int, timeout: float = 60) -> None:
        self.wait(lambda: len(self.steps()) >= k, timeout, f"{k} steps")

    def hit(self, point: str) -> int | None:
        path = self.faults / f"{point}.hit"
        if not path.exists():
            return None
        time.sleep(0.01)
        try:
            return int(path.read_text() or 0) or None
        except ValueError:
            return None

    def go_all(self) -> None:
        for point in POINTS:
            (self.faults / f"{point}.go").write_text("")

    def sigkill(self, pid: int, role: str, fault: Fault, al: str | None = None) -> None:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        fault.fired = True
        if role in ("session", "dest-session"):  # it may have been running the program
            self.t.crash_budget += 1
        if role in ("run-cli", "resume-cli", "dest-supervisor"):
            self.t.killed_supervisors.add(role)

    def sessions(self) -> list[int]:
        return [pid for pid, r in roles(self.tag).items() if r in ("session", "dest-session")]

    def settled(self, ws: str, timeout: float = 150) -> dict[str, Any]:
        """One live session named by the record, or none and the record not `running`."""

        def check() -> dict[str, Any] | None:
            rec = self.show(ws)  # `show` reaps a holder whose processes are gone
            live = self.sessions()
            if rec["state"] == "running":
                open_ = [a for a in rec["allocations"] if a["ended"] is None]
                if len(live) == 1 and len(open_) == 1 and open_[0]["id"] == rec["holder"] \
                        and open_[0]["session_pid"] == live[0]:
                    return rec
                return None
            return rec if not live else None

        return dict(self.wait(check, timeout, f"{ws} to settle (one holder, or stopped)", poll=0.1))

    def cleanup(self) -> list[int]:
        self.go_all()
        left = holders_alive(self.tag)
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p, _, _ in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        return left


class TrialError(Exception):
    pass


# -- the operations -------------------------------------------------------------------------


def point_victim(point: str) -> str:
    """The role of the process a fault point ends (the abort runs in the source's supervisor
    or, when that one died, in its session)."""
    for prefix, role in (("move.source.", "run-cli"), ("move.abort.", "run-cli"), ("move.dest.", "dest-supervisor"),
                         ("move.cli.", "move-cli"), ("move.session.", "session"), ("move.incoming.", "dest-session")):
        if point.startswith(prefix):
            return role
    return "?"


def fired_point(b: Bench, f: Fault) -> None:
    """Whether a `point:kill|exit` fault fired, and what it ended."""
    f.point = True
    point = f.label.rsplit(":", 1)[0]
    if b.hit(point) is None:
        return
    f.fired = True
    role = point_victim(point)
    if role in ("run-cli", "dest-supervisor"):
        b.t.killed_supervisors.add(role)


def fault_action(rng: random.Random) -> str:
    return "kill" if rng.random() < 0.75 else "exit"


def op_move(b: Bench, rng: random.Random) -> None:
    kind = rng.choices(["point", "sigkill-at", "sigkill-delay", "corrupt"], [0.6, 0.2, 0.12, 0.08])[0]
    run_fault = move_fault = None
    f: Fault
    if kind == "point":
        point = rng.choice(RUN_SIDE + MOVE_SIDE)
        f = Fault(f"{point}:{fault_action(rng)}")
        if point in RUN_SIDE:
            run_fault = f.label
        else:
            move_fault = f.label
        if point in SESSION_CRASH_POINTS or point.startswith("move.abort."):
            b.t.crash_budget += 1
        if rng.random() < 0.35:  # and one in the other command's processes
            other = rng.choice(MOVE_SIDE if point in RUN_SIDE else RUN_SIDE)
            g = Fault(f"{other}:{fault_action(rng)}")
            b.t.faults.append(g)
            if other in RUN_SIDE:
                run_fault = g.label
            else:
                move_fault = g.label
            if other in SESSION_CRASH_POINTS or other.startswith("move.abort."):
                b.t.crash_budget += 1
    elif kind == "sigkill-at":
        point = rng.choice(RUN_SIDE + MOVE_SIDE)
        f = Fault(f"kill -9 @ {point}")
        if point in RUN_SIDE:
            run_fault = f"{point}:wait"
        else:
            move_fault = f"{point}:wait"
    elif kind == "sigkill-delay":
        f = Fault("kill -9 after a delay")
    else:
        point = "move.source.after-capsule"
        f = Fault("corrupt chunk")
        run_fault = f"{point}:wait"
    b.t.faults.append(f)
    run, ws = b.run(run_fault)
    b.progressed(rng.randint(2, 8))
    cli = b.start("move", ws, "--to", "local", fault=move_fault)
    t0 = time.monotonic()
    delay = rng.uniform(0.0, 1.5)
    while cli.poll() is None and time.monotonic() - t0 < 150:
        if kind == "sigkill-at" and not f.fired:
            wp = (run_fault or move_fault or "").rsplit(":", 1)[0]
            if b.hit(wp) is not None:
                live = roles(b.tag)
                victims = sorted((pid, r) for pid, r in live.items() if r != "write-check")
                if victims:
                    pid, role = rng.choice(victims)
                    f.label = f"kill -9 {role} @ {wp}"
                    b.sigkill(pid, role, f)
                (b.faults / f"{wp}.go").write_text("")
        elif kind == "sigkill-delay" and not f.fired and time.monotonic() - t0 > delay:
            victims = sorted(roles(b.tag).items())
            if victims:
                pid, role = rng.choice(victims)
                f.label = f"kill -9 {role} after a delay"
                b.sigkill(pid, role, f)
            else:
                f.fired = True
        elif kind == "corrupt" and not f.fired and b.hit("move.source.after-capsule") is not None:
            damaged = 0
            for chunk in (b.root / "repo" / "chunks").rglob("*"):
                if chunk.is_file() and not chunk.name.startswith("."):
                    data = bytearray(chunk.read_bytes())
                    data[len(data) // 2] ^= 0xFF
                    chunk.write_bytes(bytes(data))
                    damaged += 1
            f.fired = damaged > 0
            b.go_all()
        time.sleep(0.01)
    if kind == "point":
        for g in b.t.faults:
            fired_point(b, g)
    if kind == "sigkill-at" and not f.fired:
        f.label = f"kill -9 @ {(run_fault or move_fault or '').rsplit(':', 1)[0]}"
    b.go_all()
    cli.wait(timeout=60)
    after_op(b, ws, run)


def op_abort(b: Bench, rng: random.Random) -> None:
    """A move the destination gives up (a crash before its swap, or a damaged chunk), with a
    second fault in the source's half: the abort itself, or what comes around it."""
    corrupt = rng.random() < 0.25
    first = Fault("corrupt chunk (abort)" if corrupt else f"{rng.choice(ABORTING)}:kill")
    near = [p for p in RUN_SIDE if "abort" in p] + ["move.session.held", "move.source.after-marker"]
    second = Fault(f"{rng.choice(near if rng.random() < 0.7 else RUN_SIDE)}:{fault_action(rng)}")
    b.t.faults += [first, second]
    # The abort's points fire in the session too when it settles the move alone (its
    # supervisor died at one): both of the program's processes may die, the source machine lost.
    if second.label.rsplit(":", 1)[0] in SESSION_CRASH_POINTS or second.label.startswith("move.abort."):
        b.t.crash_budget += 1
    run_fault = second.label + (",move.source.after-capsule:wait" if corrupt else "")
    run, ws = b.run(run_fault)
    b.progressed(rng.randint(2, 8))
    cli = b.start("move", ws, "--to", "local", fault=None if corrupt else first.label)
    t0 = time.monotonic()
    while cli.poll() is None and time.monotonic() - t0 < 150:
        if corrupt and not first.fired and b.hit("move.source.after-capsule") is not None:
            for chunk in (b.root / "repo" / "chunks").rglob("*"):
                if chunk.is_file() and not chunk.name.startswith("."):
                    data = bytearray(chunk.read_bytes())
                    data[len(data) // 2] ^= 0xFF
                    chunk.write_bytes(bytes(data))
                    first.fired = True
            (b.faults / "move.source.after-capsule.go").write_text("")
        time.sleep(0.01)
    if not corrupt:
        fired_point(b, first)
    b.go_all()
    cli.wait(timeout=60)
    fired_point(b, second)
    after_op(b, ws, run)


def op_suspend(b: Bench, rng: random.Random) -> None:
    """`sojourn suspend` then `sojourn resume`, one process killed at a random moment."""
    target = rng.choice(["run-cli", "suspend-cli", "write-check", "session", "resume-cli", "resume-session"])
    f = Fault(f"kill -9 {target} after a delay")
    b.t.faults.append(f)
    run, ws = b.run()
    b.progressed(rng.randint(2, 10))
    delay = rng.uniform(0.0, 0.6)

    def strike(role: str, within: float, proc: subprocess.Popen[bytes] | None = None) -> None:
        t0 = time.monotonic()
        while time.monotonic() - t0 < within and not f.fired:
            if time.monotonic() - t0 >= delay or role == "write-check":
                for pid, r in roles(b.tag).items():
                    if r == role:
                        b.sigkill(pid, role, f)
                        break
            if proc is not None and proc.poll() is not None:
                return
            time.sleep(0.005)

    sus = b.start("suspend", ws)
    if target in ("run-cli", "suspend-cli", "write-check", "session"):
        strike(target, 10.0, sus)
    sus.wait(timeout=120)
    if sus.returncode != 0:  # killed before its request: the program was never asked to pause
        (b.dir / "open").write_text("")
    run.wait(timeout=120)
    rec = b.settled(ws)
    if rec["state"] in ("suspended", "failed") and rec["next_action"]["action"] == "resume":
        b.t.recovered.append(rec["state"])
        res = b.start("resume", ws)
        if target in ("resume-cli", "resume-session"):
            strike("resume-cli" if target == "resume-cli" else "session", 3.0, res)
        (b.dir / "open").write_text("")
        res.wait(timeout=120)
    after_op(b, ws, run)


def op_resumes(b: Bench, rng: random.Random) -> None:
    """Suspended, then 2 to 4 `sojourn resume` at once; one of them (or the winner's session)
    killed at a random moment. The program runs once."""
    k = rng.randint(2, 4)
    target = rng.choice(["a resume", "the session"])
    f = Fault(f"kill -9 {'resume-cli' if target == 'a resume' else 'session'} ({k} concurrent resumes)")
    b.t.faults.append(f)
    run, ws = b.run()
    b.progressed(rng.randint(2, 8))
    sus = b.cli("suspend", ws)
    if sus.returncode != 0:
        raise TrialError(f"the clean suspend failed: {sus.stderr.strip()}")
    run.wait(timeout=60)
    b.t.recovered.append("suspended")
    procs = [b.start("resume", ws) for _ in range(k)]
    delay, t0 = rng.uniform(0.0, 1.0), time.monotonic()
    while any(p.poll() is None for p in procs) and time.monotonic() - t0 < 120:
        if time.monotonic() - t0 > delay + 0.5:
            (b.dir / "open").write_text("")
        if not f.fired and time.monotonic() - t0 > delay:
            if target == "a resume":
                live = [p for p in procs if p.poll() is None]
                if live:
                    b.sigkill(rng.choice(live).pid, "resume-cli", f)
            else:
                for pid, r in roles(b.tag).items():
                    if r == "session":
                        b.sigkill(pid, "session", f)
        time.sleep(0.01)
    codes = [p.wait(timeout=120) for p in procs]
    won = [c for c in codes if c not in (2, -signal.SIGKILL)]
    # A session killed before it ran leaves the workspace suspended: a later resume may win it.
    if len(won) > 1 + b.t.crash_budget:
        b.t.violations.append(f"{k} concurrent resumes: {len(won)} ran the program (exit codes {codes})")
    for p, c in zip(procs, codes, strict=True):
        if c == 2 and not b.stderr(p).strip():
            b.t.violations.append("a resume that lost said nothing")
    after_op(b, ws, run)


OPS = {"move": op_move, "abort": op_abort, "suspend": op_suspend, "resumes": op_resumes}
WEIGHTS = {"move": 0.5, "abort": 0.2, "suspend": 0.18, "resumes": 0.12}


# -- recovery and the invariants ------------------------------------------------------------


def after_op(b: Bench, ws: str, run: subprocess.Popen[bytes]) -> None:
    b.go_all()
    rec = b.settled(ws)
    for f in b.t.faults:  # a point may fire after the command that set it returned
        if f.point and not f.fired:
            fired_point(b, f)
    (b.dir / "open").write_text("")
    for _ in range(6):
        if rec["state"] == "running":
            b.wait(lambda w=ws: b.show(w)["state"] != "running", 90, f"{ws} to stop running", poll=0.1)
            rec = b.settled(ws)
            continue
        if rec["state"] == "finished":
            break
        if rec["next_action"]["action"] == "resume":
            b.t.recovered.append(rec["state"])
            res = b.cli("resume", ws)
            if res.returncode not in (0, 75, 78):
                b.t.violations.append(f"recovery: `sojourn resume` exited {res.returncode}: {res.stderr[-400:]}")
                return
            rec = b.settled(ws)
            continue
        if rec["state"] == "failed" and "is corrupt" in str(rec["detail"]) and sum(f.fired for f in b.t.faults) > 1 \
                and any(f.fired and f.label.startswith("corrupt") for f in b.t.faults):
            # Two faults at once: the move's capsule damaged, and the source's supervisor or its
            # session killed while held: the damaged capsule is all that is left of the program.
            b.t.crash_budget += 1
        if rec["state"] == "failed" and b.t.crash_budget:
            b.t.recovered.append("rerun")  # no capsule at all: the user runs the script again
            p, ws = b.run()
            p.wait(timeout=120)
            rec = b.settled(ws)
            continue
        b.t.violations.append(f"{ws} is {rec['state']} with nothing to resume from ({rec['detail']})")
        return
    if rec["state"] != "finished":
        b.t.violations.append(f"{ws} did not finish after recovery: {rec['state']}")
        return
    try:
        run.wait(timeout=30)
    except subprocess.TimeoutExpired:
        b.t.violations.append("`sojourn run` still runs after the workspace finished")
    check_invariants(b, run)


def line(i: int) -> str:
    return f"{i} {i * (i + 1) // 2}\n"


def check_invariants(b: Bench, run: subprocess.Popen[bytes]) -> None:
    t = b.t
    for f in t.faults:  # every process of the operation has ended by now
        if f.point and not f.fired:
            fired_point(b, f)
    recs = [b.show(ws) for ws in b.workspaces]
    allocs = [a for r in recs for a in r["allocations"]]
    by_pid = {a["session_pid"]: a for a in allocs if a.get("session_pid")}
    steps = b.steps()

    # Segments: consecutive steps of one session.
    segs: list[list[Any]] = []  # [pid, first, last]
    for i, pid in steps:
        if segs and segs[-1][0] == pid:
            if i != segs[-1][2] + 1:
                t.violations.append(f"steps of session {pid} not contiguous: {segs[-1][2]} then {i}")
            segs[-1][2] = i
        else:
            segs.append([pid, i, i])
    seen = [s[0] for s in segs]
    for pid in set(seen):
        if seen.count(pid) > 1:
            t.violations.append(f"session {pid} ran in {seen.count(pid)} separate stretches: two copies ran at once")
        if pid not in by_pid:
            t.violations.append(f"session {pid} ran steps but no allocation in the record names it")
    if sorted({i for i, _ in steps}) != list(range(STEPS)):
        missing = sorted(set(range(STEPS)) - {i for i, _ in steps})
        t.violations.append(f"steps lost: {missing[:10]}")
    ordered = [a["session_pid"] for a in allocs if a.get("session_pid") in seen]
    if ordered != seen:
        t.violations.append(f"sessions ran in another order than the record's allocations: {seen} vs {ordered}")

    # Each allocation starts where the capsule it resumed from stopped; that capsule is the last
    # verified one when it started.
    span = {s[0]: (s[1], s[2]) for s in segs}
    nxt: dict[str, int] = {}  # allocation -> the next step after it stopped
    writer = {c["id"]: c["allocation"] for r in recs for c in r["capsules"]}
    for r in recs:
        last_verified = None
        for ev in r["events"]:
            if ev.get("stale"):
                continue
            cap = ev.get("capsule")
            if isinstance(cap, dict) and cap.get("verified") and ev["type"] in ("capsule", "authority"):
                last_verified = cap["id"]
            if ev["type"] == "allocation" and ev["allocation"].get("capsule_in"):
                cin = ev["allocation"]["capsule_in"]
                if cin != last_verified:
                    t.violations.append(f"{ev['allocation']['id']} resumed from {cin}, not the last verified "
                                        f"capsule {last_verified}")
        for a in r["allocations"]:
            start = 0 if not a.get("capsule_in") else nxt.get(writer.get(a["capsule_in"], ""))
            got = span.get(a.get("session_pid"))
            if got is not None and start is not None and got[0] != start:
                kind = "ran again" if got[0] < start else "were skipped"
                t.violations.append(f"{a['id']} started at step {got[0]}, its capsule {a['capsule_in']} stopped "
                                    f"before step {start}: steps {min(got[0], start)}..{max(got[0], start) - 1} {kind}")
            nxt[a["id"]] = got[1] + 1 if got is not None else (start if start is not None else 0)
    t.replays = sum(1 for k in range(1, len(segs)) if segs[k][1] <= segs[k - 1][2])
    if t.replays > t.crash_budget:
        t.violations.append(f"{t.replays} stretch(es) of steps ran twice with {t.crash_budget} session(s) killed "
                            f"while running: {[tuple(s) for s in segs]}")

    # The log is the steps' output, less what a killed supervisor had read and not logged.
    log = "".join(b.cli("logs", ws, "--stream", "stdout").stdout for ws in b.workspaces)
    expected = [line(i) for i, _ in steps] + [f"done {STEPS * (STEPS - 1) // 2} {64 << 10}\n"]
    got_lines = log.splitlines(True)
    if got_lines != expected:
        terminals = "".join(b.terminal(p) for p, verb, _ in b.procs if verb in ("run", "resume"))
        budget = len(t.killed_supervisors) + t.crash_budget
        for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, expected, got_lines, autojunk=False).get_opcodes():
            if op == "equal":
                continue
            lost = expected[i1:i2]
            if op == "delete" and budget > 0 and (all(x in terminals for x in lost) or
                                                 "dest-supervisor" in t.killed_supervisors or t.crash_budget):
                budget -= 1
                continue
            t.violations.append(f"log differs from the steps' output ({op}): expected {lost[:3]} got "
                                f"{got_lines[j1:j2][:3]} (killed supervisors: {sorted(t.killed_supervisors)})")

    # `show` names what happened.
    for ws, r in zip(b.workspaces, recs, strict=True):
        text = b.cli("show", ws).stdout
        for a in r["allocations"]:
            if a["stop_reason"] and a["stop_reason"] not in text:
                t.violations.append(f"`sojourn show` does not name stop reason {a['stop_reason']} of {a['id']}")
        for ev in r["events"]:
            if ev["type"] == "move" and not ev.get("stale") and ev["outcome"] not in text:
                t.violations.append(f"`sojourn show` does not name move outcome {ev['outcome']}")
        moves = [ev for ev in r["events"] if ev["type"] == "move" and not ev.get("stale")]
        if moves:
            t.outcome = {"moved": "committed"}.get(moves[-1]["outcome"], moves[-1]["outcome"])
        elif any(ev["type"] == "request" and ev.get("move") for ev in r["events"]):
            t.outcome = "requested"
        elif t.op in ("suspend", "resumes"):
            t.outcome = "suspended" if any(a["stop_reason"] == "suspended" for a in r["allocations"]) else "none"

    # No command crashed on its own (a fault kills or exits; it never raises).
    logs = [(f"`sojourn {verb}`", Path(f"{out}.err")) for _, verb, out in b.procs]
    logs += [(f"destination {p.stem}", p) for p in (b.root / "home" / "moves").glob("*.log")]
    for who, path in logs:
        text = path.read_text(errors="replace") if path.exists() else ""
        if "Traceback" in text:
            t.violations.append(f"{who} raised: {text[text.index('Traceback'):][-600:]}")
    for p, verb, _ in b.procs:
        if verb == "move" and p.returncode not in (0, 1, 2, 3, -signal.SIGKILL):
            t.violations.append(f"`sojourn move` exited {p.returncode}: {b.stderr(p)[-300:]}")

    try:
        b.wait(lambda: not holders_alive(b.tag), 20, "the trial's processes to end")
    except TrialError:
        t.violations.append(f"processes left: {roles(b.tag)}")


def run_trial(seed: int, index: int, root: Path) -> Trial:
    rng = random.Random(f"{seed}:{index}")
    t = Trial(index, seed)
    t.op = rng.choices(list(WEIGHTS), list(WEIGHTS.values()))[0]
    t0 = time.monotonic()
    b = Bench(root / f"t{index:04d}", t)
    try:
        OPS[t.op](b, rng)
    except Exception as e:
        detail = "".join(traceback.format_exception_only(type(e), e)).strip()
        t.violations.append(f"{detail}" + (f"\n{traceback.format_exc()}" if not isinstance(e, TrialError) else ""))
    finally:
        left = b.cleanup()
        if left and not t.violations:
            t.violations.append(f"processes left: {left}")
    t.seconds = time.monotonic() - t0
    if not t.violations:
        import shutil

        shutil.rmtree(b.root, ignore_errors=True)
    else:
        (b.root / "key.hex").write_text(CAMPAIGN_KEY)
        t.violations.append(f"(scratch kept: {b.root}; SOJOURN_KEY=$(cat {b.root}/key.hex) to read it)")
    return t


# -- the campaign ---------------------------------------------------------------------------


COLUMNS = ["fired", "committed", "aborted", "refused", "requested", "suspended", "none", "then-suspended",
           "then-failed", "rerun", "replayed", "known-bug", "VIOLATIONS"]


def tally(trials: list[Trial]) -> str:
    rows: dict[str, Counter[str]] = defaultdict(Counter)
    for t in trials:
        for f in t.faults:
            label = re.sub(r"\(\d concurrent", "(n concurrent", f.label)
            c = rows[label]
            c["trials"] += 1
            c["fired"] += f.fired
            c[t.outcome] += 1
            c["then-suspended"] += "suspended" in t.recovered
            c["then-failed"] += "failed" in t.recovered
            c["rerun"] += "rerun" in t.recovered
            c["replayed"] += t.replays > 0
            c["VIOLATIONS"] += bool(t.violations)
            c["known-bug"] += bool(t.known)
    width = max([len(k) for k in rows] + [10])
    head = f"{'fault':<{width}} {'trials':>6} " + " ".join(f"{c:>{max(len(c), 5)}}" for c in COLUMNS)
    lines = [head, "-" * len(head)]
    total: Counter[str] = Counter()
    for k in sorted(rows):
        c = rows[k]
        total.update(c)
        lines.append(f"{k:<{width}} {c['trials']:>6} " + " ".join(f"{c[col]:>{max(len(col), 5)}}" for col in COLUMNS))
    lines.append("-" * len(head))
    lines.append(f"{'total':<{width}} {total['trials']:>6} "
                 + " ".join(f"{total[col]:>{max(len(col), 5)}}" for col in COLUMNS))
    return "\n".join(lines)


@pytest.mark.timeout(1500)
def test_randomized_fault_campaign(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOJOURN_KEY", CAMPAIGN_KEY)
    seed = int(os.environ.get("SOJOURN_CAMPAIGN_SEED") or random.SystemRandom().randrange(1, 10**9))
    sized = int(os.environ.get("SOJOURN_CAMPAIGN_TRIALS") or 0)
    only = [int(x) for x in os.environ.get("SOJOURN_CAMPAIGN_ONLY", "").split(",") if x.strip()]
    jobs = int(os.environ.get("SOJOURN_CAMPAIGN_JOBS") or 8)
    assert RUN_SIDE and MOVE_SIDE and ABORTING, f"fault points not found in {SRC}: {POINTS}"
    with capsys.disabled():
        print(f"\nfault campaign: seed {seed} (SOJOURN_CAMPAIGN_SEED={seed} replays it), {len(POINTS)} fault points, "
              f"{jobs} trials at a time", flush=True)
    # Short paths: the trials' scratch directories hold unix sockets and long argv.
    root = Path(tempfile.mkdtemp(prefix="sjc-", dir=tmp_path))
    trials: list[Trial] = []
    t0 = time.monotonic()
    indices = iter(only or range(sized or MAX_TRIALS))

    def fired() -> int:
        return sum(f.fired for t in trials for f in t.faults)

    with ThreadPoolExecutor(jobs) as pool:
        running: set[Any] = set()
        while True:
            enough = not only and not sized and fired() >= KILL_TARGET
            while len(running) < jobs and not enough:
                i = next(indices, None)
                if i is None:
                    break
                running.add(pool.submit(run_trial, seed, i, root))
            if not running:
                break
            done = {f for f in running if f.done()}
            for fut in done:
                running.discard(fut)
                trials.append(fut.result())
            if not done:
                time.sleep(0.05)
    trials.sort(key=lambda t: t.index)
    if os.environ.get("SOJOURN_CAMPAIGN_STRICT"):  # open bugs fail the campaign too
        for t in trials:
            t.violations += t.known
    bad = [t for t in trials if t.violations]
    with capsys.disabled():
        print(f"\nfault campaign, seed {seed}: {len(trials)} trials, {fired()} fault points fired, "
              f"{time.monotonic() - t0:.0f} s\n{tally(trials)}", flush=True)
        ops = Counter(t.op for t in trials)
        print("operations: " + ", ".join(f"{k} {v}" for k, v in sorted(ops.items())), flush=True)
        for t in trials:
            for k in t.known:
                print(f"known bug, trial {t.index} ({[f.label for f in t.faults]}): {k}", flush=True)
        for t in bad:
            print(f"\nVIOLATION trial {t.index} ({t.op}; {[f.label for f in t.faults]}; replay with "
                  f"SOJOURN_CAMPAIGN_SEED={seed} SOJOURN_CAMPAIGN_ONLY={t.index}):\n  " + "\n  ".join(t.violations),
                  flush=True)
    assert not bad, (f"{len(bad)} trial(s) broke an invariant; replay with SOJOURN_CAMPAIGN_SEED={seed} "
                     f"SOJOURN_CAMPAIGN_ONLY={','.join(str(t.index) for t in bad)}")
    if not only and not sized:
        assert fired() >= KILL_TARGET, f"only {fired()} fault points fired in {len(trials)} trials"


# -- bugs the campaign found, each replayed deterministically -------------------------------


def test_a_move_aborted_two_seconds_into_the_hold_keeps_the_program_running(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by the campaign (seed 2, trial 13): the source supervisor serves a move inside its
    watcher loop; when the abort came 2 s or more after the loop's last authority check, the
    same iteration checked the authority against the epoch it held *before* its own abort
    swap, found it taken (by itself) and killed its own program: the workspace ended `failed`
    with the move's capsule unverified. Any abort by timeout (120 s) hit it."""
    monkeypatch.setenv("SOJOURN_KEY", CAMPAIGN_KEY)
    t = Trial(0, 0, op="move")
    b = Bench(tmp_path / "t", t)
    try:
        b.gate = STEPS
        run, ws = b.run()
        b.progressed(3)
        cli = b.start("move", ws, "--to", "local", fault="move.dest.after-request:wait")
        pid = b.wait(lambda: b.hit("move.dest.after-request"), 60, "the destination to request the move")
        b.wait(lambda: any(e["type"] == "request" for e in b.show(ws)["events"]), 30, "the source to serve it")
        time.sleep(2.5)  # the source holds, waiting for a destination that is stuck
        os.kill(pid, signal.SIGKILL)
        cli.wait(timeout=60)
        (b.dir / "open").write_text("")
        assert run.wait(timeout=60) == 0, b.stderr(run)
        rec = b.show(ws)
        assert rec["state"] == "finished", (rec["state"], rec["detail"])
        assert [m["outcome"] for m in rec["events"] if m["type"] == "move" and not m.get("stale")] == ["aborted"]
        assert [i for i, _ in b.steps()] == list(range(STEPS))
    finally:
        b.cleanup()


def test_a_supervisor_killed_during_the_write_check_keeps_the_capsule(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by the campaign (seed 4, trials 80 and 137). `sojourn suspend`: the session writes
    its capsule, reports it and exits; the supervisor runs the write check (0.2 s and more)
    and only then records the capsule and the stop. A `kill -9` of the supervisor (the
    `sojourn run` command) in that window left no one to record it: the orphan path needs a
    live session, and the session has exited. The reaper recorded the allocation `failed`
    with no capsule, and the program was lost although its capsule was complete in the
    repository (docs/workspaces.md promises a `suspended` stop when the command is killed).
    The reaper (authority.reap) now finds the capsule labelled with the dead allocation,
    checks it and records `suspended` on it."""
    monkeypatch.setenv("SOJOURN_KEY", CAMPAIGN_KEY)
    b = Bench(tmp_path / "t", Trial(0, 0, op="suspend"))
    try:
        b.gate = 5
        run, ws = b.run()
        b.progressed(3)
        sus = b.start("suspend", ws)
        b.wait(lambda: [p for p, r in roles(b.tag).items() if r == "write-check"], 60, "the write check")
        os.kill(run.pid, signal.SIGKILL)
        sus.wait(timeout=60)
        rec = b.wait(lambda: (r := b.show(ws))["state"] != "running" and r, 60, "the workspace to stop")
        assert "paused (" in b.stderr(run)  # the capsule was written and reported
        assert rec["state"] == "suspended", (rec["state"], rec["detail"])
        cap = rec["last_capsule"]
        assert cap["verified"] and cap["allocation"] == rec["allocations"][0]["id"]
        assert rec["allocations"][0]["stop_reason"] == "suspended" and "recovered" in rec["detail"]
        (b.dir / "open").write_text("")
        res = b.cli("resume", ws)
        assert res.returncode == 0, res.stderr
        steps = [i for i, _ in b.steps()]
        assert steps == list(range(STEPS)), steps  # every step once: the resume started where it paused
        assert b.show(ws)["allocations"][1]["capsule_in"] == cap["id"]
    finally:
        b.cleanup()


def test_a_capsule_reported_just_before_the_session_died_is_not_dropped() -> None:
    """Found by the campaign (seed 5, trials 16, 72, 160: a destination that fails before its
    swap, and the source session killed right after it reported its capsule). The session
    wrote the capsule's line to its status pipe and died; the supervisor's main thread saw
    the exit (`_done`) before its pump thread had put that line in the inbox, and the move's
    source gave up with "the session ended before it could pause": the move was recorded
    `refused`, the capsule never, and the workspace `failed` with nothing to resume from,
    where docs/moves.md says the move goes on (abort: `suspended` on the checked capsule).
    Replayed here on the source's wait alone, with the pump's line arriving 50 ms late."""
    import queue
    import threading
    from types import SimpleNamespace

    from sojourn.workspace.migrate import _wait_capsule

    sup = SimpleNamespace(inbox=queue.Queue(), _done=threading.Event(),
                          log=SimpleNamespace(due=lambda: False, flush=lambda: None))
    sup._done.set()  # the session is gone already
    msg = {"event": "capsule", "move": "mv_1", "capsule": "cap_1", "action": "continue"}
    threading.Timer(0.05, sup.inbox.put, (msg,)).start()  # the pump, a moment later
    assert _wait_capsule(sup, "mv_1", 10.0) == msg  # type: ignore[arg-type]
