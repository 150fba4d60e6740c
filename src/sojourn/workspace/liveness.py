"""Is the process that holds a workspace still alive? And what to do when it is not.

A process is named by (host, boot id, pid, start time), see :mod:`sojourn.procs`. Only
processes of *this* host can be checked; providers answer for their own machines.

A workspace whose holder is gone (``kill -9``, a crash, a reboot) would otherwise say
"running" forever: ``authority.reap`` records it as failed.
"""

from __future__ import annotations

from sojourn.procs import alive, boot_id, hostname, me, process_start
from sojourn.workspace import records as R

__all__ = ["alive", "boot_id", "gone", "hostname", "me", "on_this_host", "process_start"]


def on_this_host(a: R.Allocation) -> bool:
    return a.host == hostname()


def gone(a: R.Allocation) -> str | None:
    """Why the allocation's processes are known to be gone, or None if they may be alive
    (or live on another host)."""
    if not on_this_host(a):
        return None
    if a.boot_id and boot_id() and a.boot_id != boot_id():
        return f"host {a.host} rebooted since the session started"
    if alive(a.pid, a.pid_start) or alive(a.session_pid, a.session_pid_start):
        return None
    if a.session_pid is None and session_running(a.id):  # its supervisor died before it recorded the pid
        return None
    pids = f"supervisor pid {a.pid}" + (f", session pid {a.session_pid}" if a.session_pid else "")
    return f"its processes ({pids}) are gone: killed or crashed"


def session_running(allocation: str) -> bool:
    """Whether a session process of ``allocation`` runs on this host, found by its command line
    (``python -m sojourn.workspace.session ... --allocation AL``): a supervisor records its
    session's pid only once the session says it started, and one killed before that leaves a
    live session (it pauses and records itself as an orphan) that the record does not name."""
    from pathlib import Path

    needle = f"\0--allocation\0{allocation}\0".encode()
    try:
        entries = list(Path("/proc").iterdir())
    except OSError:  # no /proc (macOS): the record's pids are all there is
        return False
    for d in entries:
        if not d.name.isdigit():
            continue
        try:
            cmdline = (d / "cmdline").read_bytes()
        except OSError:
            continue
        if needle in cmdline and b"\0sojourn.workspace.session\0" in cmdline:
            return True
    return False
