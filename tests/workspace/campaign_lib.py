"""The fault campaign's bench (tests/workspace/test_campaign.py): the program, the fault
points, one trial's processes and repository, and what a fault fired."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.conftest import SRC
from tests.workspace.conftest import settled_record
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
        elif "sojourn.workspace.incoming" in words or "sojourn.workspace.migrate" in words:
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
    remote: bool = False  # the source sees no pid of the destination: only its lease (docs/moves.md)


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

    def start(self, *args: str, fault: str | None = None, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        if self.t.remote and args[0] == "run":  # a test switch, not a fault: not in the trial's labels
            fault = ",".join(x for x in (fault, "move.source.as-remote:on") if x)
        env = dict(self.env, **(env or {}), **({"SOJOURN_FAULT": fault} if fault else {}))
        out = self.root / f"{len(self.procs)}-{args[0]}"
        with open(f"{out}.out", "wb") as o, open(f"{out}.err", "wb") as e:
            p = subprocess.Popen(self.cmd(*args), cwd=self.dir, env=env, stdout=o, stderr=e,
                                 stdin=subprocess.DEVNULL)
        self.procs.append((p, args[0], out))
        return p

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
            # `show` reaps a holder whose processes are gone
            return settled_record(self.show(ws), self.sessions())

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

