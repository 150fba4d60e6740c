"""Retrying store operations through transient faults, up to a deadline, visibly.

A backend says what kind of failure it met: :class:`~sojourn.errors.StoreUnavailable` for
one that may pass (a connection refused or reset, an S3 5xx or throttling answer, ``EIO`` or
``EAGAIN`` from a disk), a plain :class:`~sojourn.errors.RepositoryError` for one that will
not (no space, permission denied, a vanished repository). Only the first kind is retried,
with exponential backoff and jitter, until the operation's deadline: its own budget
(``$SOJOURN_STORE_RETRY`` seconds, 60 by default) or an earlier one a caller set for
everything it does (:meth:`RetryPolicy.deadline`, e.g. a pause that must land before a
preemption). Every wait is announced by a status line (at most one every few seconds, however
many threads wait), and so is the recovery.

Two operations are ambiguous after a failure that may have happened *after* the store acted:
an exclusive create that the store performed although its answer was lost looks, on the
retry, like a create someone else won; a removal looks like a missing object. Both are
resolved here: the create counts as ours when the object holds exactly our bytes, the
removal as done.
"""

from __future__ import annotations

import contextlib
import os
import random
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from sojourn.errors import StoreUnavailable

T = TypeVar("T")

DEFAULT_BUDGET = 60.0
_FIRST_WAIT = 0.1
_MAX_WAIT = 5.0
_STATUS_EVERY = 5.0


def default_budget() -> float:
    """Seconds one operation may spend retrying (``$SOJOURN_STORE_RETRY``; 0: never retry)."""
    try:
        return max(0.0, float(os.environ.get("SOJOURN_STORE_RETRY", DEFAULT_BUDGET)))
    except ValueError:
        return DEFAULT_BUDGET


def _to_stderr(line: str) -> None:
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass  # a closed stderr must not turn a recovered write into a failure


class RetryPolicy:
    """How long store operations of one repository retry, and where their status goes.

    ``on_status`` gets one line per announcement (default: stderr); a supervisor can route
    it to its log instead. ``sleep`` and ``clock`` exist so that the policy's own tests need
    not wait in real time.
    """

    def __init__(
        self,
        url: str,
        budget: float | None = None,
        on_status: Callable[[str], None] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.url = url
        self.budget = default_budget() if budget is None else budget
        self.on_status = on_status if on_status is not None else _to_stderr
        self.sleep = sleep
        self.clock = clock
        self._until: list[float] = []  # deadlines callers set, innermost last
        self._lock = threading.Lock()
        self._failing_since: float | None = None
        self._last_status = -1e9

    @contextlib.contextmanager
    def deadline(self, seconds: float) -> Iterator[None]:
        """Every operation in the block (on any thread) gives up by ``seconds`` from now."""
        until = self.clock() + max(0.0, seconds)
        with self._lock:
            self._until.append(until)
        try:
            yield
        finally:
            with self._lock:
                self._until.remove(until)

    def _give_up_at(self, start: float) -> float:
        with self._lock:
            ends = [start + self.budget, *self._until]
        return min(ends)

    def call(self, what: str, fn: Callable[[], T], *, resolve: Callable[[BaseException], T] | None = None) -> T:
        """``fn()``, retried through :class:`StoreUnavailable` until the deadline.

        ``resolve(error)`` decides an ambiguous outcome on a retry (see the module doc): it
        returns the result, or raises. It is only asked once an attempt failed transiently.
        """
        start = self.clock()
        attempt = 0
        while True:
            try:
                result = fn()
            except StoreUnavailable as e:
                attempt += 1
                now = self.clock()
                give_up = self._give_up_at(start)
                if now >= give_up:
                    self._done_waiting(now, failed=True)
                    raise StoreUnavailable(
                        f"{e} (gave up after {now - start:.0f} s and {attempt} attempt(s) while {what}; "
                        "nothing was lost: what was published before is intact. Try again once the store is back)"
                    ) from e
                wait = min(_MAX_WAIT, _FIRST_WAIT * 2 ** (attempt - 1)) * random.uniform(0.75, 1.25)
                wait = max(0.0, min(wait, give_up - now))
                self._announce(now, e, what, give_up)
                self.sleep(wait)
                continue
            except BaseException as e:
                if not attempt:
                    raise
                # The store answered again: whatever comes of this attempt, the outage is over.
                self._done_waiting(self.clock(), failed=False)
                if resolve is None:
                    raise
                return resolve(e)
            if attempt:
                self._done_waiting(self.clock(), failed=False)
            return result

    # -- status lines --------------------------------------------------------------------------

    def _announce(self, now: float, error: BaseException, what: str, give_up: float) -> None:
        with self._lock:
            first = self._failing_since is None
            if first:
                self._failing_since = now
            if not first and now - self._last_status < _STATUS_EVERY:
                return
            self._last_status = now
            since = now - (self._failing_since or now)
        if first:
            line = (f"sojourn: the repository {self.url} is unavailable while {what} ({error}); "
                    f"retrying for up to {max(0.0, give_up - now):.0f} s")
        else:
            line = (f"sojourn: the repository {self.url} is still unavailable after {since:.0f} s "
                    f"({error}); retrying for up to {max(0.0, give_up - now):.0f} s more")
        self.on_status(line)

    def _done_waiting(self, now: float, *, failed: bool) -> None:
        with self._lock:
            since = self._failing_since
            if since is None:
                return
            self._failing_since = None
            self._last_status = -1e9
        if not failed:
            self.on_status(f"sojourn: the repository {self.url} answers again (after {now - since:.1f} s)")
