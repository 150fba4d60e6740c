"""The write check of a capsule a session wrote, and what its manifest says about the program's
requirements."""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

from sojourn.repository.repo import Repository


def child_env() -> dict[str, str]:
    """The environment for a sojourn child process: a source checkout of sojourn stays
    importable (an installed one is found by the interpreter itself; putting its
    site-packages on another interpreter's path would load extensions built for the wrong
    Python)."""
    env = dict(os.environ)
    src = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if "site-packages" not in src and "dist-packages" not in src:
        env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def verify_capsule(repo_url: str, capsule: str, *, python: str, cwd: str, timeout: float = 600.0,
                   raise_timeout: bool = False) -> str | None:
    """Check a paused program's capsule in a fresh interpreter: every source found unchanged,
    the capsule restored and every fingerprint equal, nothing run. None when it passes,
    else why not. ``raise_timeout``: a check that does not finish in time raises
    ``TimeoutError`` (the session, checking before it exits, then keeps the capsule) instead
    of failing the capsule."""
    cmd = [python, "-m", "sojourn.execution", "--repo", repo_url, "check", capsule]
    for attempt in range(3):
        try:
            proc = subprocess.run(cmd, cwd=cwd, env=child_env(), capture_output=True, text=True, timeout=timeout,
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            if raise_timeout:
                raise TimeoutError(f"the check did not finish within {timeout:.0f} s") from None
            return f"the check did not finish within {timeout:.0f} s"
        except OSError as e:
            return f"the check could not start ({python}): {e}"
        # A checker killed by a signal (the OOM killer, a stray kill -9) said nothing about the
        # capsule; the session has exited already, so failing here would lose the program.
        if proc.returncode >= 0 or '"ok"' in proc.stdout or attempt == 2:
            break
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if doc.get("ok"):
                return None
            return str(doc.get("error") or "the check failed")
    err = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    return err[-1] if err else f"the check failed with exit code {proc.returncode}"


def capsule_facts(repo: Repository, capsule: str) -> dict[str, Any]:
    """Requirements a capsule's manifest records: the libraries it used and the machine."""
    from sojourn.capsule import format as fmt

    try:
        m = fmt.load_manifest(repo, capsule)
    except Exception:
        return {}
    return {"distributions": dict(m.distributions), "arch": m.environment.get("machine"),
            "python": m.environment.get("python")}
