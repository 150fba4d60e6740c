"""Is the process that holds a workspace still alive? And what to do when it is not.

A process is named by (host, boot id, pid, start time): the boot id tells a reboot apart,
the start time (clock ticks since boot, from ``/proc/<pid>/stat``) a reused pid. Only
processes of *this* host can be checked; issue 4's providers answer for their own machines.

A workspace whose holder is gone (``kill -9``, a crash, a reboot) would otherwise say
"running" forever: ``authority.reap`` records it as failed.
"""

from __future__ import annotations

import functools
import os
import socket
from pathlib import Path
from typing import Any

from sojourn.workspace import records as R


def hostname() -> str:
    return socket.gethostname()


@functools.lru_cache(maxsize=1)
def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def process_start(pid: int) -> int | None:
    """The start time of ``pid`` in clock ticks since boot, or None if there is no such
    process (or no /proc to ask)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z":  # a zombie has finished; its parent just has not reaped it
        return None
    return int(fields[19])


def me() -> dict[str, Any]:
    """This process, as an allocation or an epoch names it."""
    return {"host": hostname(), "boot_id": boot_id(), "pid": os.getpid(), "pid_start": process_start(os.getpid())}


def alive(pid: int | None, start: int | None) -> bool:
    if not pid:
        return False
    if Path("/proc/self/stat").exists():
        now = process_start(pid)
        return now is not None and (start is None or now == start)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
