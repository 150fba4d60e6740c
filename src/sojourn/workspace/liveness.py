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
    pids = f"supervisor pid {a.pid}" + (f", session pid {a.session_pid}" if a.session_pid else "")
    return f"its processes ({pids}) are gone: killed or crashed"
