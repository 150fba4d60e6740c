"""Naming a process so that another process can tell, later, whether it still runs.

A process is (host, boot id, pid, start time): the boot id tells a reboot apart, the start
time (clock ticks since boot, from ``/proc/<pid>/stat``) a reused pid. Only processes of
*this* host can be checked. Workspace authority, repository locks and the local provider all
use this one definition.
"""

from __future__ import annotations

import functools
import os
import socket
from pathlib import Path
from typing import Any


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
    """This process, as an allocation, an epoch or a lock names it."""
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
