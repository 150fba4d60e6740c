"""cloudpickle's own test suite as sojourn's conformance suite.

One conformance run:

1. **record**: cloudpickle's ``tests/cloudpickle_test.py`` runs under this interpreter with
   the ``cpshim`` plugin, which sends each object the suite round-trips through
   ``sojourn.capture`` into one repository (and restores it here, so the test goes on);
2. **echo**, per Python version with a venv (``.venv3.11``, ``.venv3.12``, ``.venv3.13``):
   one fresh interpreter of that version restores every recorded capsule and captures what
   came back (``echo.py``), all of them in one process;
3. **replay**, per version: the suite runs again here, each round trip handing the test the
   object restored from that version's capsule, so the test's own assertions judge what
   went there and back.

``check`` compares each test's outcome with ``table.py``. Run it by hand with
``python -m tests.conformance.harness`` (pass counts per version).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.conformance import table

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
SRC = ROOT / "src"
SOURCE = "cloudpickle-2.2.1"
SUITE = "tests/cloudpickle_test.py"
VERSIONS = ("3.11", "3.12", "3.13")


def venv_python(version: str) -> Path | None:
    py = ROOT / f".venv{version}" / "bin" / "python"
    return py if py.exists() else None


@dataclass
class Run:
    """What one conformance run found."""

    collected: list[str]
    record: dict[str, dict[str, Any]]
    replays: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)  # version -> tests
    echo_errors: dict[str, str] = field(default_factory=dict)  # version -> why its echo failed
    seconds: dict[str, float] = field(default_factory=dict)
    installed: dict[str, set[str]] = field(default_factory=dict)  # version -> table's `needs` found there


def _env(cp_root: Path, work: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    # cloudpickle's own package and test package from the unpacked archive; sojourn from this
    # tree; the plugin from this folder. Not this repository's root: its ``tests`` package
    # would hide cloudpickle's.
    env["PYTHONPATH"] = os.pathsep.join(
        [str(SRC), str(HERE), str(cp_root), str(cp_root / "tests" / "cloudpickle_testpkg")])
    env["SOJOURN_HOME"] = str(work / "home")
    env.pop("SOJOURN_REPO", None)
    env.pop("SOJOURN_KEY", None)
    env["SOJOURN_CP_REPO"] = str(work / "repo")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(extra)
    return env


def _pytest(cp_root: Path, work: Path, mode: str, select: list[str], tag: str,
            timeout: float, **extra: str) -> dict[str, Any]:
    sel = work / f"select-{tag}.json"
    sel.write_text(json.dumps(select))
    direct = work / "direct.json"
    direct.write_text(json.dumps([n for n in select if (e := table.entry(n)) is not None and e.direct]))
    report = work / f"report-{tag}.json"
    # --assert=plain: pytest's assertion rewriting compiles the suite's module into code its
    # source does not say, and sojourn (rightly) refuses to rebuild a function from a source
    # that does not match its running code.
    # -s: the suite's tests see the process's own sys.stderr (which travels as "the
    # destination's"), not pytest's capture file.
    cmd = [sys.executable, "-m", "pytest", "-p", "cpshim", "-p", "no:cacheprovider", "-q", "--assert=plain", "-s",
           "--no-header", "-W", "ignore::DeprecationWarning", SUITE]
    proc = subprocess.run(cmd, cwd=cp_root, env=_env(cp_root, work, SOJOURN_CP_MODE=mode, SOJOURN_CP_REPORT=str(report),
                                                     SOJOURN_CP_SELECT=str(sel), SOJOURN_CP_DIRECT=str(direct), **extra),
                          capture_output=True, text=True, timeout=timeout)
    if not report.exists():
        raise RuntimeError(f"cloudpickle's suite ({mode}) wrote no report; exit {proc.returncode}\n"
                           f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return json.loads(report.read_text())  # type: ignore[no-any-return]


def run(cp_root: Path, work: Path, versions: list[str], timeout: float = 600) -> Run:
    import time

    work.mkdir(parents=True, exist_ok=True)
    # Collect everything (to check the table knows it); run what the table does not call n/a.
    t0 = time.perf_counter()
    rec = _pytest(cp_root, work, "record", _runnable(cp_root, work), "record", timeout)
    out = Run(collected=rec["collected"], record=rec["tests"])
    out.seconds["record"] = time.perf_counter() - t0
    replayable = [n for n, e in rec["tests"].items()
                  if e["outcome"] in ("passed", "failed") and any(isinstance(c, str) for c in e["capsules"])]
    for v in versions:
        py = venv_python(v)
        assert py is not None
        needs = sorted({m for e in table.TABLE.values() for m in e.needs})
        probe = subprocess.run([str(py), "-c", "import importlib.util as u, sys; print(' '.join("
                                "m for m in sys.argv[1:] if u.find_spec(m)))", *needs],
                               capture_output=True, text=True, timeout=60)
        out.installed[v] = set(probe.stdout.split())
        t0 = time.perf_counter()
        echoed = work / f"echoed-{v}.json"
        proc = subprocess.run([str(py), str(HERE / "echo.py"), str(work / "repo"), str(work / "report-record.json"),
                               str(echoed)], cwd=cp_root, env=_env(cp_root, work), capture_output=True, text=True,
                              timeout=timeout)
        if proc.returncode != 0 or not echoed.exists():
            out.echo_errors[v] = f"exit {proc.returncode}: {proc.stderr[-3000:]}"
            continue
        out.seconds[f"echo {v}"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        rep = _pytest(cp_root, work, "replay", replayable, f"replay-{v}", timeout, SOJOURN_CP_ECHOED=str(echoed))
        out.replays[v] = rep["tests"]
        out.seconds[f"replay {v}"] = time.perf_counter() - t0
    return out


def _runnable(cp_root: Path, work: Path) -> list[str]:
    """Node ids of the suite the table does not call n/a (collected without running)."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", SUITE],
                          cwd=cp_root, env=_env(cp_root, work), capture_output=True, text=True, timeout=300)
    ids = [ln.strip() for ln in proc.stdout.splitlines() if "::" in ln]
    if not ids:
        raise RuntimeError(f"cloudpickle's suite collected nothing\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return [n for n in ids if (e := table.entry(n)) is None or e.kind != "n/a"]


# -- judging ----------------------------------------------------------------------------------


def _judge(e: table.Entry, t: dict[str, Any] | None, missing: tuple[str, ...] = ()) -> str | None:
    """Why this outcome of a test contradicts the table (None when it agrees)."""
    if t is None:
        return "did not run"
    outcome, error, at = t["outcome"], t.get("error") or "", t.get("at")
    if missing:
        if outcome == "passed":
            return f"passed although {', '.join(missing)} is not installed there"
        if not any(f"No module named '{m}'" in error for m in missing):
            return f"failed, but not by naming the missing {', '.join(missing)}: {error[:500]}"
        return None
    trips = [c for c in t["capsules"] if c is not None]
    if e.kind == "passes":
        if outcome != "passed":
            return f"{outcome}: {error[:500]} (at: {at})"
        if not trips:
            return "passed without a single round trip through sojourn: it tests cloudpickle itself (n/a)"
        return None
    if e.kind == "refused":
        refusals = "\n".join(t["refused"])
        if e.match not in refusals:
            return f"not refused with {e.match!r}: {outcome}: {error[:500]}"
        return None
    if e.kind == "differs":
        if outcome == "passed":
            return "passed: the table says it differs by design; say passes"
        if at != e.at and at not in e.also_at:
            return f"failed elsewhere than at {e.at!r}: at {at!r}: {error[:500]}"
        return None
    if e.kind == "open":
        if outcome == "passed":
            return f"passed: the open bug ({e.reason}) looks fixed; say passes"
        return None
    return f"ran although the table calls it {e.kind}"


def check(r: Run) -> list[str]:
    """Every contradiction between the run and the table, one line each."""
    wrong = []
    for nodeid in r.collected:
        e = table.entry(nodeid)
        if e is None:
            wrong.append(f"{nodeid}: not in tests/conformance/table.py")
            continue
        if e.kind == "n/a":
            continue
        why = _judge(e, r.record.get(nodeid))
        if why is not None:
            wrong.append(f"{nodeid} [record here]: {why}")
            continue
        if e.kind in ("passes", "differs"):
            for v, tests in r.replays.items():
                missing = tuple(m for m in e.needs if m not in r.installed.get(v, ()))
                why = _judge(e, tests.get(nodeid), missing)
                if why is not None:
                    wrong.append(f"{nodeid} [through {v}]: {why}")
    for v, why in r.echo_errors.items():
        wrong.append(f"the fresh {v} interpreter failed: {why}")
    return wrong


def counts(r: Run) -> dict[str, dict[str, int]]:
    """Per version: tests the table says pass that passed there, of how many."""
    names = [n for n in r.collected if (e := table.entry(n)) is not None and e.kind == "passes"]
    out = {}
    for v, tests in r.replays.items():
        ok = sum(1 for n in names if tests.get(n, {}).get("outcome") == "passed")
        lacking = sum(1 for n in names if any(m not in r.installed.get(v, ()) for m in _needs(n)))
        out[v] = {"passed": ok, "of": len(names), "library missing there": lacking}
    kinds: dict[str, int] = {}
    for n in r.collected:
        e = table.entry(n)
        kinds[e.kind if e else "unknown"] = kinds.get(e.kind if e else "unknown", 0) + 1
    out["table"] = kinds
    return out


def _needs(nodeid: str) -> tuple[str, ...]:
    e = table.entry(nodeid)
    return e.needs if e is not None else ()


def main() -> None:
    import tempfile

    sys.path.insert(0, str(ROOT))
    from tests.thirdparty import fetch

    cp_root = fetch(SOURCE)
    versions = [v for v in (sys.argv[1:] or VERSIONS) if venv_python(v) is not None]
    work = Path(tempfile.mkdtemp(prefix="sojourn-conformance-"))
    r = run(cp_root, work, versions)
    print(json.dumps({"counts": counts(r), "seconds": {k: round(v, 1) for k, v in r.seconds.items()},
                      "work": str(work)}, indent=1))
    for line in check(r):
        print(line)


if __name__ == "__main__":
    main()
