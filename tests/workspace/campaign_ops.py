"""The fault campaign's operations (a move, a move forced to abort, suspend + resume,
concurrent resumes), the recovery a user would do, the invariants checked after each
trial, and the tally (tests/workspace/test_campaign.py)."""

from __future__ import annotations

import difflib
import random
import re
import signal
import subprocess
import time
import traceback
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from tests.workspace.campaign_lib import (
    ABORTING,
    CAMPAIGN_KEY,
    MOVE_SIDE,
    RUN_SIDE,
    SESSION_CRASH_POINTS,
    STEPS,
    Bench,
    Fault,
    Trial,
    TrialError,
    fault_action,
    fired_point,
    roles,
)
from tests.workspace.test_move import holders_alive


def op_move(b: Bench, rng: random.Random) -> None:
    kind = rng.choices(["point", "sigkill-at", "sigkill-delay", "corrupt"], [0.6, 0.2, 0.12, 0.08])[0]
    run_fault = move_fault = None
    f: Fault

    def place(pt: str) -> Fault:
        """A fault at ``pt``, armed in the command whose processes pass that point."""
        nonlocal run_fault, move_fault
        fault = Fault(f"{pt}:{fault_action(rng)}")
        if pt in RUN_SIDE:
            run_fault = fault.label
        else:
            move_fault = fault.label
        if pt in SESSION_CRASH_POINTS or pt.startswith("move.abort."):
            b.t.crash_budget += 1
        return fault

    if kind == "point":
        point = rng.choice(RUN_SIDE + MOVE_SIDE)
        f = place(point)
        if rng.random() < 0.35:  # and one in the other command's processes
            b.t.faults.append(place(rng.choice(MOVE_SIDE if point in RUN_SIDE else RUN_SIDE)))
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
    # Some moves as if the destination ran on another host: the source cannot see its pid and
    # notices its death by its lease only (own generator: a seed replays the same trials).
    b.t.remote = random.Random(f"{b.t.seed}:{b.t.index}:remote").random() < 0.3
    run, ws = b.run(run_fault)
    b.progressed(rng.randint(2, 8))
    cli = b.start("move", ws, "--to", "local", fault=move_fault,
                  env={"SOJOURN_MOVE_LEASE": "2"} if b.t.remote else None)
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

    # The log is the steps' output, whichever supervisor was killed (docs/workspaces.md, Logs):
    # only a session killed between a step's write and its print loses that step's line.
    log = "".join(b.cli("logs", ws, "--stream", "stdout").stdout for ws in b.workspaces)
    expected = [line(i) for i, _ in steps] + [f"done {STEPS * (STEPS - 1) // 2} {64 << 10}\n"]
    got_lines = log.splitlines(True)
    if got_lines != expected:
        budget = t.crash_budget
        for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, expected, got_lines, autojunk=False).get_opcodes():
            if op == "equal":
                continue
            lost = expected[i1:i2]
            if op == "delete" and len(lost) <= budget:
                budget -= len(lost)
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

