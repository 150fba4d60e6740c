"""The store fault campaign's bench and one trial (tests/workspace/test_store_campaign.py).

A trial: a real `sojourn run` of a counting program (the kill campaign's script), a store
fault drawn among FAULTS started after a drawn number of steps, a pause (`sojourn suspend`
or SIGTERM to the command) asked at a drawn moment during the fault, the store back after a
drawn time (some outages outlast the retry deadline), then, while the program still runs,
a second pause with the store healthy; then `sojourn resume` in a fresh process until the
program ends. The invariants are checked on what the user sees: the steps file, the
commands' output and `sojourn show`."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.conftest import SRC
from tests.repository.faultproxy import FaultProxy
from tests.workspace.campaign_lib import CAMPAIGN_KEY, SCRIPT
from tests.workspace.test_move import holders_alive

HOOK = Path(__file__).with_name("storefault_hook")
STEPS = 40
RETRY = 3.0  # $SOJOURN_STORE_RETRY of the trials: outages drawn up to 5 s outlast it
LOCAL_FAULTS = ["vanished", "swapped", "enospc", "eio", "slow-disk"]
S3_FAULTS = ["s3-outage", "s3-slow"]


@dataclass
class StoreTrial:
    index: int
    fault: str
    pause: str = ""
    at_step: int = 0
    hold: float = 0.0
    outcome: str = ""  # what the first pause did: "suspended", "refused" (the program ran on)
    lost: list[str] = field(default_factory=list)
    doubled: list[str] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # the trial itself broke (counted as a failure)
    seconds: float = 0.0

    @property
    def failed(self) -> bool:
        return bool(self.lost or self.doubled or self.wrong or self.errors)


def expected_output() -> list[str]:
    total, out = 0, []
    for i in range(STEPS):
        total += i
        out.append(f"{i} {total}")
    out.append(f"done {total} {64 << 10}")
    return out


class StoreBench:
    def __init__(self, root: Path, t: StoreTrial, s3: Any | None, bucket: str | None):
        self.t = t
        self.root = root
        self.dir = root / "work"
        self.dir.mkdir(parents=True)
        self.fdir = root / "faults"
        self.fdir.mkdir()
        self.tag = uuid.uuid4().hex
        self.mount: Path | None = None
        self.proxy: FaultProxy | None = None
        self.broken = False
        env = dict(os.environ)
        for name in ("SOJOURN_FAULT", "KILLS", "AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN"):
            env.pop(name, None)
        env["PYTHONPATH"] = os.pathsep.join([str(HOOK), str(SRC)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        if t.fault in S3_FAULTS:
            assert s3 is not None and bucket
            from urllib.parse import urlparse

            u = urlparse(s3.endpoint)
            self.proxy = FaultProxy((u.hostname or "127.0.0.1", u.port or 80), delay=0.15)
            env.update(s3.env())
            self.direct = dict(env)
            env["AWS_ENDPOINT_URL"] = self.proxy.start()
            self.repo = f"s3://{bucket}/sc-{self.tag[:12]}"
        else:
            base = root
            if t.fault == "enospc":
                base = root / "mnt"
                base.mkdir()
                subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(base)], check=True,
                               capture_output=True)
                self.mount = base
            self.repo = str(base / "repo")
            self.direct = env
        env.update(SOJOURN_CACHE=str(root / "cache"), SOJOURN_REPO=self.repo, SOJOURN_HOME=str(root / "home"),
                   SOJOURN_TEST_TAG=self.tag, SOJOURN_NOTICES="none", SOJOURN_KEY=CAMPAIGN_KEY, COLUMNS="200",
                   SOJOURN_STORE_RETRY=str(RETRY), SOJOURN_STOREFAULT_DIR=str(self.fdir),
                   SOJOURN_STOREFAULT_REPO=self.repo)
        self.direct = dict(self.direct, **{k: v for k, v in env.items() if k != "AWS_ENDPOINT_URL"})
        self.env = env
        (self.dir / "count.py").write_text(SCRIPT)
        self.procs: list[tuple[subprocess.Popen[bytes], Path]] = []

    # -- processes ------------------------------------------------------------------------

    def start(self, *args: str) -> subprocess.Popen[bytes]:
        out = self.root / f"{len(self.procs)}-{args[0]}"
        with open(f"{out}.out", "wb") as o, open(f"{out}.err", "wb") as e:
            p = subprocess.Popen([sys.executable, "-m", "sojourn.cli.main", *args], cwd=self.dir, env=self.env,
                                 stdout=o, stderr=e, stdin=subprocess.DEVNULL)
        self.procs.append((p, out))
        return p

    def out(self, p: subprocess.Popen[bytes], stream: str = "out") -> str:
        for q, path in self.procs:
            if q is p:
                return Path(f"{path}.{stream}").read_text(errors="replace")
        return ""

    def cli(self, *args: str, timeout: float = 90, direct: bool = False) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "sojourn.cli.main", *args], cwd=self.dir,
                              env=self.direct if direct else self.env, capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)

    def show(self, ws: str) -> dict[str, Any]:
        p = self.cli("show", ws, "--json", direct=True)
        if p.returncode != 0:
            raise TrialError(f"`sojourn show` failed: {p.stderr.strip()[-400:]}")
        return dict(json.loads(p.stdout))

    def steps(self) -> list[int]:
        path = self.dir / "steps.txt"
        return [int(ln.split()[0]) for ln in path.read_text().splitlines()] if path.exists() else []

    def sessions(self) -> list[int]:
        live = []
        for pid in holders_alive(self.tag):
            try:
                if b"sojourn.workspace.session" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    live.append(pid)
            except OSError:
                pass
        return live

    # -- faults ---------------------------------------------------------------------------

    def break_store(self) -> None:
        f, repo = self.t.fault, Path(self.repo)
        self.broken = True
        if f == "s3-outage":
            assert self.proxy
            self.proxy.mode = "down"
        elif f == "s3-slow":
            assert self.proxy
            self.proxy.mode = "slow"
        elif f == "vanished":
            repo.rename(repo.with_name("repo.away"))
        elif f == "swapped":
            from sojourn.repository.repo import open_repository

            repo.rename(repo.with_name("repo.away"))
            open_repository(str(repo), create=True).close()  # another repository, another id, in its place
        elif f == "enospc":
            with open(repo.parent / "filler", "wb") as fh:
                try:
                    while True:
                        fh.write(b"\0" * (1 << 20))
                        fh.flush()
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
        elif f == "eio":
            (self.fdir / "eio").write_text("")
        elif f == "slow-disk":
            (self.fdir / "slow").write_text("")

    def mend_store(self) -> None:
        f, repo = self.t.fault, Path(self.repo)
        if not self.broken:
            return
        self.broken = False
        if self.proxy:
            self.proxy.mode = "up"
        elif f in ("vanished", "swapped"):
            if f == "swapped":
                shutil.rmtree(repo)
            repo.with_name("repo.away").rename(repo)
        elif f == "enospc":
            (repo.parent / "filler").unlink()
        else:
            for name in ("eio", "slow"):
                (self.fdir / name).unlink(missing_ok=True)

    def cleanup(self) -> None:
        try:
            self.mend_store()
        except OSError:
            pass
        for pid in holders_alive(self.tag):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p, _ in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        if self.proxy:
            self.proxy.stop()
        if self.mount:
            subprocess.run(["umount", "-l", str(self.mount)], capture_output=True)


class TrialError(Exception):
    pass


def wait(pred: Any, timeout: float, what: str, poll: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(poll)
    raise TrialError(f"timed out after {timeout:.0f} s waiting for {what}")


# -- one trial ----------------------------------------------------------------------------


def run_trial(seed: int, i: int, root: Path, kinds: list[str], s3: Any | None, bucket: str | None) -> StoreTrial:
    import random

    rng = random.Random(f"{seed}:{i}")
    t = StoreTrial(i, kinds[i % len(kinds)])
    t.pause = rng.choice(["suspend", "sigterm"])
    t.at_step = rng.randint(2, 12)
    gate = rng.randint(t.at_step + 2, STEPS - 5)
    t.hold = round(rng.uniform(0.3, 5.0), 2)
    lead = rng.uniform(0.0, 0.8)  # the fault begins this long before the pause is asked
    t0 = time.monotonic()
    b = StoreBench(root / f"t{i}", t, s3, bucket)
    try:
        _trial(b, gate, lead)
    except TrialError as e:
        t.errors.append(str(e))
    except Exception as e:  # the trial's own failure is a failure too, never a pass
        t.errors.append(f"{type(e).__name__}: {e}")
    finally:
        b.cleanup()
        t.seconds = time.monotonic() - t0
    return t


def _trial(b: StoreBench, gate: int, lead: float) -> None:
    import re

    t = b.t
    run = b.start("run", "count.py", str(STEPS), str(gate))
    wait(lambda: len(b.steps()) >= t.at_step or run.poll() is not None, 90, f"{t.at_step} steps")
    m = re.search(r"workspace (ws_[0-9a-f]+)", b.out(run, "err"))
    if not m or run.poll() is not None:
        raise TrialError(f"the run did not start: {b.out(run, 'err')[-400:]}")
    ws = m.group(1)
    b.break_store()
    time.sleep(lead)
    asked = time.monotonic()
    sus = b.start("suspend", ws) if t.pause == "suspend" else None
    if sus is None:
        run.send_signal(signal.SIGTERM)
    while time.monotonic() - asked < t.hold:
        if len(b.sessions()) > 1:
            t.doubled.append(f"two live sessions during the fault: {b.sessions()}")
        time.sleep(0.1)
    b.mend_store()
    # The pause settles: the command ends suspended, or the pause was refused and the
    # program runs on (the retry deadline passed during the fault).
    try:
        wait(lambda: run.poll() is not None or (sus is not None and sus.poll() is not None)
             or "pause refused" in b.out(run, "err"), RETRY + 30, "the pause to land or be refused")
    except TrialError:
        pass
    if sus is not None and sus.poll() is None:
        sus.wait(timeout=60)
    time.sleep(0.3)
    if run.poll() is None:
        t.outcome = "refused"
        rec = b.show(ws)
        if rec["state"] != "running" or len(b.sessions()) != 1:
            t.lost.append(f"the pause was refused but the workspace is {rec['state']} with sessions {b.sessions()}:"
                          f" {rec['detail']}")
            return
        again = b.cli("suspend", ws)  # the store is back: this pause must land
        if again.returncode != 0:
            t.lost.append(f"`sojourn suspend` with the store back failed: {again.stderr.strip()[-300:]}")
        try:
            run.wait(timeout=60)
        except subprocess.TimeoutExpired:
            t.lost.append("`sojourn run` went on after a successful suspend")
            return
    else:
        t.outcome = "suspended"
    if run.returncode != 75:
        t.lost.append(f"`sojourn run` ended {run.returncode}, not 75 (suspended): {b.out(run, 'err').strip()[-400:]}")
    rec = wait(lambda: (r := b.show(ws))["state"] != "running" and r, 60, "the record to settle")
    cap = rec.get("last_capsule") or {}
    if rec["state"] != "suspended" or not cap.get("verified"):
        t.lost.append(f"after the pause the workspace is {rec['state']} (capsule {cap.get('id')}, verified "
                      f"{cap.get('verified')}): {rec['detail']}")
        return
    if b.sessions():
        t.doubled.append(f"a session lives on after the pause: {b.sessions()}")
    (b.dir / "open").write_text("")
    res = b.start("resume", ws)  # a fresh process restores the capsule
    try:
        res.wait(timeout=120)
    except subprocess.TimeoutExpired as e:
        raise TrialError("`sojourn resume` did not end in 120 s") from e
    if res.returncode != 0:
        t.lost.append(f"`sojourn resume` ended {res.returncode}: {b.out(res, 'err').strip()[-400:]}")
    steps = b.steps()
    if len(steps) != len(set(steps)):
        t.doubled.append(f"steps done twice: {sorted({s for s in steps if steps.count(s) > 1})}")
    if sorted(set(steps)) != list(range(STEPS)):
        t.lost.append(f"steps missing: {sorted(set(range(STEPS)) - set(steps))}")
    if steps != sorted(steps):
        t.wrong.append("steps out of order")
    output = [ln for p in (run, res) for ln in b.out(p).splitlines()]
    if output != expected_output():
        t.wrong.append(f"the output differs from an unpaused run's: {output[-5:]}")
    final = b.show(ws)
    if final["state"] != "finished":
        t.lost.append(f"the workspace ended {final['state']}: {final['detail']}")
    try:
        wait(lambda: not holders_alive(b.tag), 20, "the trial's processes to end")
    except TrialError:
        t.doubled.append(f"processes left: {holders_alive(b.tag)}")
