"""Suspend: the kernel writes its capsule, checks it, and exits; its machine is free. The
notebook keeps the same kernel id: the provisioner starts a stand-in (``stub.py``) that
holds the ports, and the next request resumes the workspace on the chosen machine through
the move path (restore, check every fingerprint, swap, replay the request).

By command (``%sojourn suspend [--on MACHINE]``) or when idle (``%sojourn autosuspend 30m``,
``$SOJOURN_AUTOSUSPEND``, the kernelspec's ``autosuspend``). The machine it resumes on:
``--on``, else ``%sojourn resume --on MACHINE`` said before, else ``$SOJOURN_RESUME_ON`` (the
kernelspec's ``resume_on``), else the machine it runs on now.

The workspace record: a ``capsule`` event (reason ``suspend``), then the allocation
``stopped`` with reason ``suspended`` (state ``suspended``); the resumed process takes the
next epoch with a new allocation (``resumed``).
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
import threading
import time
from typing import Any

from sojourn.notebook import control
from sojourn.notebook.handover import (
    ARRIVALS,
    MoveFailed,
    answer,
    current_request,
    hand_over_and_exit,
    installed_packages,
)

_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def parse_duration(text: str | None) -> float | None:
    """``30m``, ``90s``, ``1.5h``, ``45`` (seconds) -> seconds; ``off``/``0``/empty -> None."""
    if text is None or str(text).strip().lower() in ("", "off", "0", "none", "never"):
        return None
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(s|m|min|h)?\s*", str(text).lower())
    if not m:
        raise ValueError(f"cannot read {text!r} as a duration; write e.g. 30m, 90s or 1h (or off)")
    return float(m.group(1)) * _UNITS[m.group(2) or ""]


def suspend(ctl: Any, machine: Any, *, idle: bool = False) -> str:
    """Capsule, check, hand the ports to a stand-in, exit. Returns only on failure (raises)."""
    from sojourn import ops
    from sojourn.ops import notebook as nb

    kernel = getattr(ctl.shell, "kernel", None)
    if kernel is None:
        raise MoveFailed("only a Jupyter kernel can suspend (this is a terminal IPython)")
    t0 = time.time()
    ch = control.connect()  # first: a kernel without the provisioner says so before capturing
    try:
        m, notes, _ = ctl.checkpoint("suspend", in_cell=not idle)
        # This process's memory is about to go: the capsule must restore, on the machine it
        # will resume on. A full restore in a fresh interpreter of that machine's python.
        rep = ops.verify(m.id, ctl.repo.url, python=machine.python)
        if not rep.ok:
            raise MoveFailed(f"the capsule {m.id} did not restore in a fresh {machine.name} interpreter, so "
                             f"this kernel does not suspend (it keeps running). Why: {rep.error}")
        took = time.time() - t0
        text = (f"suspended at capsule {m.id} ({m.size / 2**20:.1f} MiB, {m.stats.get('bytes_written', 0) / 2**20:.1f}"
                f" MiB written, restored and checked in a fresh interpreter) in {took:.2f} s; pid {os.getpid()} "
                f"exited and released machine {ctl.machine}. The next cell resumes on {machine.name}.\n")
        text += "".join(f"note: {n}\n" for n in notes)
        ans = answer(ch, {
            "op": "suspend", "machine": machine.name, "python": machine.python, "memory": machine.memory,
            "preload": installed_packages(),
            "plan": {"capsule": m.id, "workspace": ctl.session.workspace, "kernel_info": kernel.kernel_info,
                     "plan": {"capsule": m.id, "repo": ctl.repo.url, "workspace": ctl.session.workspace,
                              "moved_from": None, "machine": machine.name}}}, 120)
    except BaseException:
        ch.close()  # the provisioner takes a closed channel as "cancel"
        raise
    if ans.get("status") != "release":
        ch.close()
        raise MoveFailed(f"the kernel could not suspend; it keeps running. Why: {ans.get('error')}")
    # The point of no return: the stand-in holds nothing yet but waits for the ports.
    try:
        nb.record_stop(ctl.session, "suspended", capsule=m.id, detail=f"resumes on {machine.name}")
    except Exception as e:  # the capsule is good; the record says "running" until the resume fences it
        text += f"note: the workspace record could not say 'suspended': {type(e).__name__}: {e}\n"
    handoff: dict[str, Any] = {"text": text, "header": None, "idents": [],
                               "carry": {"autosave": bool(ctl.autosave.enabled), "autosuspend": ctl.idle.seconds,
                                         "resume_on": ctl.resume_on}}
    if not idle:
        idents, header = current_request(kernel)
        handoff.update(idents=control.pack_frames(idents), header=header,
                       execution_count=int(ctl.shell.execution_count) - 1)
    hand_over_and_exit(ch, kernel, handoff)
    raise AssertionError("unreachable")


class IdleSuspend:
    """Suspends the kernel once no request has run for ``seconds``."""

    def __init__(self, ctl: Any):
        self.ctl = ctl
        self.seconds: float | None = None
        self.last_error: str | None = None
        self._thread: threading.Thread | None = None
        self._busy = False

    def set(self, seconds: float | None) -> None:
        self.seconds = seconds
        ARRIVALS.last_activity = time.monotonic()
        if seconds and self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="sojourn-autosuspend", daemon=True)
            self._thread.start()

    def _watch(self) -> None:
        while True:
            secs = self.seconds
            if not secs:
                time.sleep(1.0)
                continue
            idle = time.monotonic() - ARRIVALS.last_activity
            if idle >= secs and not self._busy:
                self._busy = True
                kernel = getattr(self.ctl.shell, "kernel", None)
                loop = getattr(kernel, "io_loop", None)
                if loop is None:
                    self._busy = False
                else:
                    loop.add_callback(lambda: asyncio.ensure_future(self._suspend_now()))
            time.sleep(min(1.0, max(0.05, secs / 10)))

    async def _suspend_now(self) -> None:
        """On the kernel's main thread, holding the cell lock: no cell runs meanwhile."""
        kernel = self.ctl.shell.kernel
        lock = getattr(kernel, "_main_asyncio_lock", None)
        try:
            if lock is not None:
                await lock.acquire()
            try:
                secs = self.seconds
                if not secs or self.ctl.autosave.in_cell or time.monotonic() - ARRIVALS.last_activity < secs:
                    return  # something ran meanwhile
                from sojourn.notebook import machines

                machine = machines.resolve(self.ctl.resume_machine(), None, self.ctl.repo)
                suspend(self.ctl, machine, idle=True)
            finally:
                if lock is not None:
                    lock.release()
        except BaseException as e:
            self.last_error = f"{type(e).__name__}: {e}"
            print(f"sojourn: the idle suspend failed; the kernel keeps running. Why: {self.last_error}",
                  file=sys.__stderr__)
        finally:
            ARRIVALS.last_activity = time.monotonic()  # next try after another idle period
            self._busy = False
