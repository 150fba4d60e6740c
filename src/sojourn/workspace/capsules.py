"""The write check of a capsule a session wrote, and what its manifest says about the program's
requirements."""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

from sojourn import threads
from sojourn.repository.repo import Repository


def child_env() -> dict[str, str]:
    """The environment for a sojourn child process: a source checkout of sojourn stays
    importable (an installed one is found by the interpreter itself; putting its
    site-packages on another interpreter's path would load extensions built for the wrong
    Python). The repositories this process works in are pinned in the child too
    (``repository.repo.pin``): a session never writes into a new repository at their URL."""
    from sojourn.repository.repo import PIN_ENV, pins

    env = dict(os.environ)
    known = pins()
    if known:  # the child works in the same repositories as this process, never a new one there
        env[PIN_ENV] = json.dumps(known, sort_keys=True)
    src = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if "site-packages" not in src and "dist-packages" not in src:
        env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    # Under `ulimit -v`: few malloc arenas, so that sojourn's threads leave the limit to the program.
    return threads.session_env(env)


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
            # The check restores all of the program's state next to a program that may still
            # hold it: under a soft address-space limit it runs with the hard one.
            proc = subprocess.run(cmd, cwd=cwd, env=child_env(), capture_output=True, text=True, timeout=timeout,
                                  stdin=subprocess.DEVNULL, preexec_fn=threads.lift_soft_limit)
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


def record_python(rec: Any, allocation: Any = None) -> str:
    """The interpreter to run a workspace's code with when none was asked for: the one its
    record says it last ran with (``allocation``'s, else the newest allocation's, else the
    command's), if the record is signed through and this host has it; else this one.

    A record with unsigned (format-1) parts is never trusted with a path to execute: anyone
    who can write the repository could have written it (docs/records-format.md)."""
    import sys

    if getattr(rec, "unsigned", 1):
        return sys.executable
    cands = [allocation.python] if allocation is not None else []
    cands += [a.python for a in reversed(rec.allocations)] + [rec.command.python]
    for cand in cands:
        if cand and os.path.isabs(cand) and os.access(cand, os.X_OK):
            return str(cand)
    return sys.executable


def check_capsule_owner(repo: Repository, rec: Any, capsule: str, *, forked: bool) -> None:
    """Refuse to carry workspace ``rec`` on from a capsule that another workspace's session
    wrote (its signed manifest's ``sojourn.workspace`` label names the writer). A fork's
    signed log names its origin's capsule on purpose (``forked``); a record with unsigned
    parts gets no such trust: only its own capsules resume it."""
    from sojourn.capsule import format as fmt
    from sojourn.workspace.errors import WorkspaceError

    m = fmt.load_manifest(repo, capsule)  # the signature is checked before any label is read
    label = m.labels.get("sojourn.workspace")
    owner = label.get("workspace") if isinstance(label, dict) else None
    if owner == rec.id:
        return
    if not getattr(rec, "unsigned", 1) and (forked or owner is None):
        return
    whose = f"workspace {owner}" if owner else "no workspace (its manifest names none)"
    raise WorkspaceError(
        f"capsule {capsule} belongs to {whose}, not to {rec.id}: refusing to resume {rec.id} from it (nothing was "
        "run). Its record names it through events nobody signed with the repository key; check the repository "
        f"for tampering, or fork the capsule's workspace on purpose (`sojourn fork {owner or 'WS'}`)")
