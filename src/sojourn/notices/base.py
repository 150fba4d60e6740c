"""What every notice source shares: the :class:`Notice` it produces, the two kinds of source
(polled metadata endpoints and signals), and a small HTTP helper over the standard library.

A polled source answers :meth:`PolledSource.poll` with ``None`` (no notice yet) or a
:class:`Notice`; it raises :class:`Unreachable` when its endpoint cannot be reached (the
watcher backs off and says so once). A signal source names the signal that, where it is
configured, means "this allocation is being taken away" (Slurm's ``--signal``, Kubernetes'
SIGTERM).
"""

from __future__ import annotations

import email.utils
import json
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from sojourn.errors import SojournError

# A metadata server answers in milliseconds; one that does not answer within this is not
# there (a laptop, a container outside the cloud), and the watcher backs off.
CONNECT_TIMEOUT = 2.0


class Unreachable(SojournError):
    """The source's endpoint did not answer (or answered something it never answers)."""


@dataclass(frozen=True)
class Notice:
    """One preemption notice: where it came from, what the platform will do, how long is left.

    ``deadline``: seconds from ``received`` until the machine goes away (``None`` where the
    platform does not say, e.g. AWS's rebalance recommendation). ``payload``: what the
    platform sent, as it sent it (parsed JSON, text, or the signal's name).
    """

    source: str  # "aws", "aws-rebalance", "gcp", "azure", "slurm", "kubernetes"
    action: str  # "terminate", "stop", "hibernate", "rebalance", "preempt", "signal"
    deadline: float | None
    detail: str
    payload: Any = None
    received: float = field(default_factory=time.time)

    def remaining(self, now: float | None = None) -> float | None:
        if self.deadline is None:
            return None
        return self.deadline - ((now if now is not None else time.time()) - self.received)

    def pause_deadline(self, now: float | None = None) -> float | None:
        """Seconds the session may take to reach a statement boundary: what is left, less a
        margin for writing the capsule (a quarter of it, at most 10 s, at least 1 s left)."""
        left = self.remaining(now)
        if left is None:
            return None
        return max(1.0, left - min(10.0, left / 4))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class PolledSource:
    """A metadata endpoint asked every ``interval`` seconds (in its own thread)."""

    name = "polled"
    interval = 5.0
    timeout = CONNECT_TIMEOUT

    def poll(self) -> Notice | None:
        raise NotImplementedError

    def acknowledge(self, notice: Notice) -> None:
        """Tell the platform we are done with ``notice`` (only Azure has this); the default
        does nothing."""

    def describe(self) -> str:
        return self.name


@dataclass(frozen=True)
class SignalSource:
    """A signal that means a notice where this source is configured."""

    name: str
    signum: int
    deadline: float | None  # seconds between the signal and the hard end
    action: str = "signal"

    def notice(self) -> Notice:
        import signal as _signal

        sig = _signal.Signals(self.signum).name
        left = f"; {self.deadline:g} s left" if self.deadline is not None else ""
        return Notice(self.name, self.action, self.deadline, f"{sig} from {self.name}{left}", sig)

    def describe(self) -> str:
        import signal as _signal

        return f"{self.name} ({_signal.Signals(self.signum).name})"


# -- HTTP over urllib (no dependencies; metadata servers speak plain HTTP) --------------------


@dataclass
class Response:
    status: int
    body: bytes
    headers: dict[str, str]

    def json(self) -> Any:
        try:
            return json.loads(self.body or b"null")
        except ValueError as e:
            raise Unreachable(f"the endpoint answered something that is not JSON: {self.body[:200]!r}") from e

    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace").strip()


def http(method: str, url: str, headers: dict[str, str] | None = None, body: bytes | None = None,
         timeout: float = CONNECT_TIMEOUT) -> Response:
    """One request; HTTP error statuses come back as responses, unreachable hosts raise."""
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    # A proxy from the environment must never see metadata requests (they are link-local).
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=timeout) as r:
            return Response(r.status, r.read(), {k.lower(): v for k, v in r.headers.items()})
    except urllib.error.HTTPError as e:
        try:
            data = e.read()
        except OSError:
            data = b""
        return Response(e.code, data, {k.lower(): v for k, v in (e.headers or {}).items()})
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        raise Unreachable(f"{method} {url}: {reason}") from e


def seconds_until(stamp: str, now: float | None = None) -> float | None:
    """Seconds from ``now`` to an ISO 8601 (``2017-09-18T08:22:00Z``) or RFC 1123
    (``Tue, 09 Aug 2022 17:07:32 GMT``) time; ``None`` when it cannot be read."""
    stamp = (stamp or "").strip()
    if not stamp:
        return None
    now = time.time() if now is None else now
    try:
        t = datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        try:
            t = email.utils.parsedate_to_datetime(stamp).timestamp()
        except (TypeError, ValueError):
            return None
    return t - now
