"""The corpus harness: run a third-party program unmoved, then under `sojourn run` with pauses
at random points, resumed each time (alternating interpreters where its libraries exist), and
compare what it printed.

Everything here is the harness; the programs themselves come from pinned PyPI archives
(``tests/thirdparty.py``) and are copied into a temporary workspace, with their licence file
beside them (``manifest.py`` says which file of which archive, what replaces data loading,
and which output lines are timings).

A run's pauses are drawn from one seed (``SOJOURN_CORPUS_SEED`` replays it): for each pause, a
point in the program's unmoved CPU time (5-80 %) and a way to ask (``sojourn suspend`` or SIGTERM
to the ``sojourn run``/``resume`` command). What is counted, per program:

* requested: pauses asked for while the program was running;
* landed: the command exited 75 with a checked capsule, and the workspace was suspended;
* refused: the program was told no and kept running (the messages are kept);
* late: the request reached the program after its last statement had begun (the program says
  so as it ends: "it reached no statement of its own after the request"); no tool could land
  it, so it is left out of the share that landed;
* missed: the program ended without the pause landing, although it reached statements of its
  own after the request, or without ever hearing of the request (not a refusal: nothing said
  no, but something should have);
* failed: the pause ended the process without a checked capsule (exit 76, a failed write
  check), or a resume was refused (then the job carries on from the same capsule on the first
  interpreter); the job is *lost* when nothing is left to resume from, or the resumed
  program cannot finish;
* wrong: the finished program's stdout (``sojourn logs``), less the manifest's timing lines,
  differs from the unmoved run's, or a compared output file differs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.corpus.manifest import PROGRAMS, Program
from tests.thirdparty import SOURCES, fetch

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
STANDINS = Path(__file__).resolve().parent / "standins"

# Every Python the project's venvs provide: 3.11 is the one with torch, pandas and scikit-learn.
PYTHONS = {"3.11": ROOT / ".venv" / "bin" / "python",
           "3.12": ROOT / ".venv3.12" / "bin" / "python",
           "3.13": ROOT / ".venv3.13" / "bin" / "python"}

WS_RE = re.compile(r"workspace (ws_[0-9a-f]+)")


def corpus_seed() -> int:
    env = os.environ.get("SOJOURN_CORPUS_SEED")
    return int(env) if env else random.SystemRandom().randrange(1, 10**6)


@dataclass
class Outcome:
    program: str
    seed: int
    pythons: list[str] = field(default_factory=list)  # the interpreter of each process, in order
    plain_s: float = 0.0  # CPU seconds of the unmoved run
    requested: int = 0
    landed: int = 0
    refused: list[str] = field(default_factory=list)
    missed: int = 0
    late: int = 0
    failed: list[str] = field(default_factory=list)
    lost: bool = False
    wrong: str = ""  # a diff, when the output differs
    error: str = ""  # the harness could not run the program unmoved (not counted as sojourn's)
    notes: list[str] = field(default_factory=list)
    sojourn_s: float = 0.0
    compared: bool = False  # the paused run finished and its output was compared

    @property
    def ok(self) -> bool:
        return not (self.error or self.wrong or self.lost or self.failed or self.refused) and \
            self.landed + self.late == self.requested

    def verdict(self) -> str:
        if self.error:
            return "not run"
        if self.wrong:
            return "WRONG OUTPUT"
        return "output equal" if self.compared else "output not compared"

    def line(self) -> str:
        return (f"{self.program}: seed {self.seed}, {self.landed}/{self.requested} pauses landed, "
                f"{len(self.refused)} refused, {self.missed} missed, {self.late} late, {len(self.failed)} failed, "
                f"{'LOST' if self.lost else 'not lost'}, {self.verdict()}; "
                f"pythons {' -> '.join(self.pythons)}")


# -- the workspace -----------------------------------------------------------------------


def prepare(prog: Program, base: Path) -> tuple[Path, Path]:
    """A fresh workspace for ``prog`` at ``base/work`` (and its library stand-ins at
    ``base/lib``, outside the workspace so that sojourn treats them as installed libraries)."""
    work, lib = base / "work", base / "lib"
    for d in (work, lib):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    src = fetch(prog.source)
    for dst, rel in prog.files.items():
        target = work / dst
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / rel, target)
    shutil.copyfile(src / SOURCES[prog.source].license, work / f"LICENSE-{prog.source}")
    for name in prog.standins:
        shutil.copyfile(STANDINS / name, work / name)
    for name in prog.lib_standins:
        shutil.copyfile(STANDINS / name, lib / name)
    if prog.driver:
        (work / prog.entry).write_text(prog.driver)
    for path, old, new in prog.replace:
        f = work / path
        text = f.read_text()
        if text.count(old) != 1:
            raise AssertionError(f"{prog.name}: {path} holds {text.count(old)} copies of {old!r}, not one")
        f.write_text(text.replace(old, new))
    if prog.data is not None:
        prog.data(work)
    return work, lib


def environment(base: Path, lib: Path, cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SOJOURN_", "KILLS"))}
    env.update(
        PYTHONPATH=os.pathsep.join([str(SRC), str(lib)]),
        SOJOURN_HOME=str(base / "home"), SOJOURN_REPO=str(base / "repo"), SOJOURN_CACHE=str(cache),
        SOJOURN_NOTICES="none", MPLBACKEND="Agg", PYTHONHASHSEED="0", COLUMNS="200",
        # One thread each: the same floating-point sums in every process, and no oversubscription.
        OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
        PYTHONDONTWRITEBYTECODE="1",
    )
    return env


_IMPORTABLE: dict[tuple[str, tuple[str, ...]], bool] = {}


def pythons_for(prog: Program) -> list[str]:
    """The interpreters (versions) on which the program's libraries import."""
    found = []
    for v, py in PYTHONS.items():
        if not py.exists():
            continue
        key = (v, prog.libs)
        if key not in _IMPORTABLE:
            code = "; ".join(f"import {m}" for m in prog.libs) or "pass"
            _IMPORTABLE[key] = subprocess.run([str(py), "-c", code], capture_output=True).returncode == 0
        if _IMPORTABLE[key]:
            found.append(v)
    return found


def filtered(prog: Program, text: str) -> str:
    pats = [re.compile(p) for p in prog.filters]
    return "".join(ln for ln in text.splitlines(keepends=True) if not any(p.search(ln) for p in pats))


def digests(prog: Program, work: Path) -> dict[str, str]:
    out = {}
    for name in prog.outputs:
        p = work / name
        out[name] = hashlib.sha256(p.read_bytes()).hexdigest() if p.exists() else "missing"
    return out


# -- running -------------------------------------------------------------------------------


def plain_run(prog: Program, py: str, work: Path, env: dict[str, str], timeout: float) -> tuple[int, str, str, float]:
    """Exit code, stdout, stderr and the CPU seconds the unmoved run took (CPU time, not
    wall time: the points of a paused run are drawn in it, whatever the machine's load)."""
    with open(work.parent / "plain.out", "w+") as out, open(work.parent / "plain.err", "w+") as err:
        p = subprocess.Popen([py, prog.entry, *prog.args], cwd=work, env=env, stdout=out, stderr=err)
        deadline = time.monotonic() + timeout
        while p.poll() is None and time.monotonic() < deadline:
            cpu = _cpu(p.pid) or 0.0
            time.sleep(0.05)
        if p.poll() is None:
            p.kill()
            p.wait()
            cpu = 0.0
        else:
            cpu = max(cpu, 0.0)
        out.seek(0)
        err.seek(0)
        return p.returncode, out.read(), err.read(), cpu


_TICK = os.sysconf("SC_CLK_TCK")


def _cpu(pid: int) -> float | None:
    """User + system CPU seconds of a live process (and its waited-for children)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])) / _TICK


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def cli(py: str, *args: str, env: dict[str, str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([py, "-m", "sojourn.cli.main", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


class Session:
    """One `sojourn run` / `sojourn resume` command in the background, its output in files."""

    def __init__(self, py: str, args: list[str], cwd: Path, env: dict[str, str], logdir: Path, n: int):
        self.out_path, self.err_path = logdir / f"{n}.out", logdir / f"{n}.err"
        # Open for the command's whole life (closed in close()): its output goes to files, never a pipe.
        self._out, self._err = open(self.out_path, "w"), open(self.err_path, "w")  # noqa: SIM115
        self.proc = subprocess.Popen([py, "-m", "sojourn.cli.main", *args], cwd=cwd, env=env,
                                     stdout=self._out, stderr=self._err, start_new_session=True)
        self.started = time.monotonic()

    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def workspace(self, timeout: float = 60) -> str | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = WS_RE.search(self.stderr())
            if m:
                return m.group(1)
            if self.proc.poll() is not None:
                return None
            time.sleep(0.02)
        return None

    def session_cpu(self) -> float | None:
        """CPU seconds of the session process (the supervisor's child that runs the program)."""
        kids = _children(self.proc.pid)
        return _cpu(kids[0]) if kids else None

    def wait_cpu(self, target: float, timeout: float) -> int | None:
        """Wait until the session has used ``target`` CPU seconds, or the command ended (its
        exit code)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rc = self.proc.poll()
            if rc is not None:
                return rc
            cpu = self.session_cpu()
            if cpu is not None and cpu >= target:
                return None
            time.sleep(0.02)
        return None

    def wait(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._out.close()
        self._err.close()


_STARTUP: dict[str, float] = {}


def startup(version: str, cache: Path) -> float:
    """CPU seconds a session takes before a script's first statement, measured once per
    interpreter on a one-line script (about 0.5 s). The random points of a run are drawn in
    the program's own CPU time, counted from there; a pause asked for before that would land
    at the program's first statement (signals are held from the first line since finding C3),
    not at a point of the program."""
    if version in _STARTUP:
        return _STARTUP[version]
    import tempfile

    with tempfile.TemporaryDirectory(dir=cache.parent if cache.parent.exists() else None) as tmp:
        base = Path(tmp)
        (base / "work").mkdir()
        (base / "work" / "first.py").write_text("import time\nprint('first statement', flush=True)\ntime.sleep(0.5)\n")
        env = environment(base, base, cache)
        sess = Session(str(PYTHONS[version]), ["run", "first.py"], base / "work", env, base, 0)
        try:
            sess.workspace()
            cpu = 0.0
            while "first statement" not in sess.out_path.read_text() and sess.proc.poll() is None:
                cpu = sess.session_cpu() or cpu
                time.sleep(0.01)
            _STARTUP[version] = cpu + 0.1
            sess.wait(60)
        finally:
            sess.close()
    return _STARTUP[version]


def _refusals(text: str) -> list[str]:
    lines = text.splitlines()
    out = []
    for i, ln in enumerate(lines):
        if "pause refused" in ln:
            detail = [ln2.strip() for ln2 in lines[i + 1:i + 4] if ln2.startswith("  - ")]
            out.append(" | ".join([ln.split("sojourn: ", 1)[-1], *detail]))
    return out


def run_program(prog: Program, base: Path, cache: Path, seed: int, pauses: int,
                pythons: list[str] | None = None, log: Any = None) -> Outcome:
    """The whole check of one program: unmoved runs, then one paused run, compared."""
    out = Outcome(prog.name, seed)
    say = log or (lambda s: None)
    rng = random.Random(f"{seed}:{prog.name}")
    versions = pythons if pythons is not None else pythons_for(prog)
    versions = [v for v in versions if v in pythons_for(prog)]
    if not versions:
        out.error = f"none of the interpreters can import {', '.join(prog.libs)}"
        return out
    base.mkdir(parents=True, exist_ok=True)

    # Unmoved runs: the expected output, on each interpreter (an interpreter whose own unmoved
    # output differs, with other library versions, is left out of the paused run).
    expected: str | None = None
    expected_files: dict[str, str] = {}
    usable = []
    for v in versions:
        work, lib = prepare(prog, base)
        env = environment(base, lib, cache)
        rc, stdout, stderr, secs = plain_run(prog, str(PYTHONS[v]), work, env, prog.timeout)
        if rc != 0:
            if v == versions[0]:
                out.error = f"the unmoved run on {v} failed with exit code {rc}:\n{stderr[-3000:]}"
                return out
            out.notes.append(f"unmoved run on {v} failed ({rc}): left out")
            continue
        if expected is None:
            expected, expected_files, out.plain_s = filtered(prog, stdout), digests(prog, work), secs
            usable.append(v)
        elif filtered(prog, stdout) == expected and digests(prog, work) == expected_files:
            usable.append(v)
        else:
            out.notes.append(f"unmoved output on {v} differs from {versions[0]}'s (library versions): left out")
    assert expected is not None

    # The paused run, in a fresh copy of the same workspace at the same path.
    work, lib = prepare(prog, base)
    env = environment(base, lib, cache)
    shutil.rmtree(base / "repo", ignore_errors=True)
    shutil.rmtree(base / "home", ignore_errors=True)
    logdir = base / "logs"
    shutil.rmtree(logdir, ignore_errors=True)
    logdir.mkdir()
    span = out.plain_s
    points = sorted(rng.uniform(0.05, 0.8) * span for _ in range(pauses))  # CPU seconds of the program
    ways = [rng.choice(("suspend", "sigterm")) for _ in range(pauses)]
    order = [usable[i % len(usable)] for i in range(pauses + 1)]  # 3.11, 3.12, 3.13, 3.11, ...
    t_start = time.monotonic()
    n = 0
    sess = Session(str(PYTHONS[order[0]]), ["run", "--scan-interval", "0", prog.entry, *prog.args], work, env, logdir, n)
    out.pythons.append(order[0])
    sessions = [sess]
    try:
        ws = sess.workspace()
        if ws is None:
            out.failed.append(f"`sojourn run` ended before naming a workspace: {sess.stderr()[-2000:]}")
            out.lost = True
            return out
        done_at = 0.0  # program time (CPU seconds of the unmoved run) already behind us
        retried = False
        pending = list(range(pauses))
        while pending:
            i = pending.pop(0)
            delay = max(0.0, points[i] - done_at)
            base_cpu = startup(order[min(n, len(order) - 1)], cache)
            if sess.wait_cpu(base_cpu + delay, prog.timeout * 3) is not None:
                break  # ended before this pause was due: no more pauses asked for
            refusals_before = len(_refusals(sess.stderr()))
            out.requested += 1
            say(f"{prog.name}: pause {i + 1} by {ways[i]} at {points[i]:.2f} s of {span:.2f} s")
            sus: subprocess.CompletedProcess[str] | None = None
            if ways[i] == "suspend":
                sus = cli(str(PYTHONS["3.11"]), "suspend", ws, "--json", "--deadline", str(prog.deadline),
                          env=env, cwd=work, timeout=prog.deadline + 120)
            else:
                with contextlib.suppress(ProcessLookupError):
                    sess.proc.send_signal(signal.SIGTERM)
            rc = _wait_outcome(sess, refusals_before, prog.deadline + 60)
            if rc is not None and rc < 0:
                # The command itself died of the signal; its session runs on as an orphan,
                # which pauses itself and records the stop (docs/workspaces.md).
                out.notes.append(f"pause {i + 1} ({ways[i]}): the `sojourn` command died of signal {-rc}")
                rec = _settled(env, work, ws, prog.deadline + 60)
                rc = 75 if rec.get("state") == "suspended" else (0 if rec.get("state") == "finished" else 76)
            if rc is None:  # still running: refused (or a suspend that gave up)
                new = _refusals(sess.stderr())[refusals_before:]
                msg = new[0] if new else (sus.stdout.strip() or sus.stderr.strip() if sus else "no answer")
                out.refused.append(f"pause {i + 1} ({ways[i]}): {msg}")
                done_at = points[i] + max(0.0, (sess.session_cpu() or 0.0) - base_cpu - delay)
                continue
            if rc == 75:
                rec = _show(env, work, ws)
                if rec.get("state") != "suspended":
                    out.failed.append(f"pause {i + 1} ({ways[i]}): exit 75 but the workspace is {rec.get('state')}: "
                                      f"{rec.get('detail')}")
                    out.lost = True
                    return out
                out.landed += 1
                done_at = points[i]
                n += 1
                v = order[n] if n < len(order) else usable[0]
                sess = Session(str(PYTHONS[v]), ["resume", ws, "--python", str(PYTHONS[v])], work, env, logdir, n)
                sessions.append(sess)
                out.pythons.append(v)
                continue
            if rc == 0:
                ended = _ended(sess.stderr())
                said = ((sus.stdout + sus.stderr).strip().replace("\n", " | ") if sus else "")
                said = f" (suspend said: {said[-400:]})" if said else ""
                if ended is not None and "came too late" in ended:
                    out.late += 1
                    out.notes.append(f"pause {i + 1} ({ways[i]}) late: {ended}{said}")
                else:  # the program never heard of it, or heard and did not land it
                    out.missed += 1
                    out.notes.append(f"pause {i + 1} ({ways[i]}) missed: "
                                     f"{ended or 'the request never reached the program before it ended'}{said}")
                break
            # Anything else ended the process without a checked capsule.
            rec = _show(env, work, ws)
            detail = (sus.stdout + sus.stderr).strip() if sus else ""
            if rec.get("state") == "suspended" and not retried:
                # The resume itself was refused (its capsule is still the workspace's): not a
                # lost job. Counted as failed; the job carries on from there on the first
                # interpreter, and this pause is asked for again.
                out.failed.append(f"resume on {out.pythons[-1]} (pause {i + 1} pending): exit {rc}: {rec.get('detail')}")
                out.requested -= 1
                retried = True
                n += 1
                sess = Session(str(PYTHONS[usable[0]]), ["resume", ws, "--python", str(PYTHONS[usable[0]])], work,
                               env, logdir, n)
                sessions.append(sess)
                out.pythons.append(usable[0])
                pending.insert(0, i)
                continue
            out.failed.append(f"pause {i + 1} ({ways[i]}): exit {rc}, workspace {rec.get('state')}: "
                              f"{rec.get('detail')} {detail} {_tail(sess.stderr())}")
            # A failed pause (76, killed by the signal) leaves the last good capsule; a program
            # that crashed after a resume (exit 1 with a traceback) cannot finish: lost.
            crashed = rc not in (76, 128 + signal.SIGTERM, -signal.SIGTERM)
            out.lost = crashed or not rec.get("last_capsule") or rec.get("state") not in ("suspended", "failed")
            return out
        rc = sess.wait(prog.timeout * 3 + 120)
        if rc not in (0, None) and not retried and _show(env, work, ws).get("state") == "suspended":
            rec = _show(env, work, ws)
            out.failed.append(f"resume on {out.pythons[-1]}: exit {rc}: {rec.get('detail')}")
            n += 1
            sess = Session(str(PYTHONS[usable[0]]), ["resume", ws, "--python", str(PYTHONS[usable[0]])], work,
                           env, logdir, n)
            sessions.append(sess)
            out.pythons.append(usable[0])
            rc = sess.wait(prog.timeout * 3 + 120)
        if rc is None:
            out.failed.append(f"the program did not end within {prog.timeout * 3 + 120:.0f} s")
            out.lost = True
            return out
        if rc != 0:
            rec = _show(env, work, ws)
            out.failed.append(f"the last process exited {rc}: workspace {rec.get('state')}: {rec.get('detail')} "
                              f"{_tail(sess.stderr())}")
            out.lost = True
            return out
        out.compared = True
        logs = cli(str(PYTHONS["3.11"]), "logs", ws, "--stream", "stdout", env=env, cwd=work)
        got = filtered(prog, logs.stdout)
        if got != expected:
            out.wrong = _diff(expected, got)
        files = digests(prog, work)
        if files != expected_files:
            out.wrong += f"\noutput files differ: {files} != {expected_files}"
        out.sojourn_s = time.monotonic() - t_start
        return out
    finally:
        for s in sessions:
            s.close()


def _ended(text: str) -> str | None:
    """The program's own word on a pause that was pending when it ended (pause.ended)."""
    for ln in reversed(text.splitlines()):
        if "after a pause was asked for" in ln:
            return ln.split("sojourn: ", 1)[-1].strip()
    return None


def _wait_outcome(sess: Session, refusals_before: int, timeout: float) -> int | None:
    """The command's exit code once the pause settled, or None when it was refused and the
    program runs on."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rc = sess.proc.poll()
        if rc is not None:
            return rc
        if len(_refusals(sess.stderr())) > refusals_before:
            return None
        time.sleep(0.05)
    return None


def _show(env: dict[str, str], cwd: Path, ws: str) -> dict[str, Any]:
    p = cli(str(PYTHONS["3.11"]), "show", ws, "--json", env=env, cwd=cwd)
    try:
        return dict(json.loads(p.stdout))
    except ValueError:
        return {"state": "unknown", "detail": p.stderr.strip()}


def _settled(env: dict[str, str], cwd: Path, ws: str, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    rec = _show(env, cwd, ws)
    while rec.get("state") == "running" and time.monotonic() < deadline:
        time.sleep(0.5)
        rec = _show(env, cwd, ws)
    return rec


def _tail(text: str, n: int = 1500) -> str:
    return text[-n:].strip()


def _diff(a: str, b: str) -> str:
    import difflib

    return "".join(list(difflib.unified_diff(a.splitlines(True), b.splitlines(True), "unmoved", "paused"))[:60])


def programs(names: list[str] | None = None) -> Iterator[Program]:
    for p in PROGRAMS:
        if not names or p.name in names:
            yield p


def table(outcomes: list[Outcome]) -> str:
    rows = [("program", "kind", "pythons", "unmoved CPU s", "requested", "late", "landed", "refused", "missed",
             "failed", "lost", "output")]
    kinds = {p.name: p.kind for p in PROGRAMS}
    for o in outcomes:
        rows.append((o.program, kinds.get(o.program, "?"), "→".join(o.pythons) or "-", f"{o.plain_s:.1f}",
                     str(o.requested), str(o.late), str(o.landed), str(len(o.refused)), str(o.missed),
                     str(len(o.failed)),
                     "LOST" if o.lost else "no", o.verdict().replace("output ", "")))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def summary(outcomes: list[Outcome], seed: int) -> str:
    late = sum(o.late for o in outcomes)
    req = sum(o.requested for o in outcomes) - late
    landed = sum(o.landed for o in outcomes)
    pct = 100.0 * landed / req if req else 100.0
    return (f"corpus (seed {seed}): {len(outcomes)} programs, {landed}/{req} requested pauses landed ({pct:.1f} %; "
            f"{late} more asked for after the program's last statement had begun), "
            f"{sum(len(o.refused) for o in outcomes)} refused, {sum(o.missed for o in outcomes)} missed, "
            f"{sum(len(o.failed) for o in outcomes)} failed, {sum(1 for o in outcomes if o.wrong)} wrong outputs, "
            f"{sum(1 for o in outcomes if o.lost)} lost jobs, {sum(1 for o in outcomes if o.error)} not run "
            f"(targets: >= 95 % landed, 0 wrong, 0 lost)")


if __name__ == "__main__":  # pragma: no cover - bench/bench_corpus.py is the entry point
    sys.exit("run bench/bench_corpus.py")
