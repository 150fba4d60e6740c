"""Following the answer to a request (suspend, checkpoint) in a workspace's event log.

``sojourn suspend`` and ``sojourn checkpoint`` write a request object and then read the
events the holder's supervisor appends: ``request`` (it was picked up), ``waiting`` (what a
pending pause waits for), ``refused`` (with each object's path), then the verb's own answer.
What both need in common lives here: events of an older epoch are skipped, a refusal raises
:class:`PauseRefused`, ``wait`` bounds the wait, and a holder whose processes died on this
host is reaped instead of waited for.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from sojourn.workspace import records as R
from sojourn.workspace.authority import reap
from sojourn.workspace.errors import WorkspaceError
from sojourn.workspace.liveness import gone, on_this_host
from sojourn.workspace.store import WorkspaceStore

ProgressCallback = Callable[[str, dict[str, Any]], None]


class PauseRefused(WorkspaceError):
    """The session refused the pause (state that cannot travel); it keeps running."""

    def __init__(self, message: str, problems: list[dict[str, Any]]):
        super().__init__(message)
        self.problems = problems


class RequestFollower:
    """Iterate over the events that follow request ``n`` of ``rec``'s epoch; ``ours`` tells
    whether the holder picked the request up, ``waited`` what the pause waited for."""

    def __init__(self, store: WorkspaceStore, rec: R.WorkspaceRecord, n: int, *, kind: str | None,
                 verb: str, wait: float | None, on_progress: ProgressCallback | None):
        assert rec.current is not None
        self.store, self.rec, self.n, self.kind, self.verb = store, rec, n, kind, verb
        self.allocation = rec.current
        self.wait, self.on_progress = wait, on_progress
        self.ours = False
        self.waited: list[str] = []
        self.t0 = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def __iter__(self) -> Iterator[dict[str, Any]]:
        ws, epoch = self.rec.id, self.rec.epoch
        cursor = self.rec.upto
        interval = 0.5 if type(self.store.backend).__name__ == "S3Backend" else 0.05
        last_live_check = time.monotonic()
        while True:
            for ev in self.store.events(ws, cursor + 1):
                cursor = int(ev["seq"])
                if int(ev.get("epoch", 0)) < epoch:
                    continue
                if not self._common(ev):
                    yield ev
            if self.wait is not None and self.elapsed() > self.wait:
                raise WorkspaceError(f"no answer from workspace {ws} within {self.wait:g} s; the {self.verb} request "
                                     "stays pending, `sojourn show` tells what it waits for")
            if time.monotonic() - last_live_check > 1.0:
                last_live_check = time.monotonic()
                if on_this_host(self.allocation) and gone(self.allocation):
                    after = reap(self.store, self.store.record(ws), by=f"sojourn {self.verb}")
                    raise WorkspaceError(f"the session of {ws} died before it could answer the {self.verb} request; "
                                         f"state {after.state}, {after.next_action.hint}")
            time.sleep(interval)

    def _common(self, ev: dict[str, Any]) -> bool:
        """Handle the events every request gets; True when ``ev`` was one of them."""
        kind = ev.get("type")
        if kind == "request" and ev.get("n") == self.n and (self.kind is None or ev.get("kind") == self.kind):
            self.ours = True
            if self.on_progress:
                self.on_progress("requested", ev)
            return True
        if kind == "waiting" and self.ours:
            self.waited.append(str(ev.get("why")))
            if self.on_progress:
                self.on_progress("waiting", ev)
            return True
        if kind == "refused" and self.ours:
            raise PauseRefused(str(ev.get("message", "the pause was refused")), list(ev.get("problems") or []))
        if kind == "authority" and int(ev.get("epoch", 0)) > self.rec.epoch:
            raise WorkspaceError(f"workspace {self.rec.id} was taken by {ev.get('holder')} (a move?) while the "
                                 f"{self.verb} request was pending; ask again")
        return False
