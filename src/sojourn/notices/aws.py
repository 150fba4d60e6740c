"""AWS EC2: the spot ``instance-action`` (two minutes before a stop, hibernation or
termination) and the rebalance recommendation (an earlier "elevated risk"), both read from
the instance metadata service with the IMDSv2 token flow.

    PUT  /latest/api/token                                 X-aws-ec2-metadata-token-ttl-seconds: 21600
    GET  /latest/meta-data/spot/instance-action            X-aws-ec2-metadata-token: <token>
         404 until a notice, then {"action": "terminate", "time": "2017-09-18T08:22:00Z"}
    GET  /latest/meta-data/events/recommendations/rebalance
         404 until a recommendation, then {"noticeTime": "2020-10-27T08:22:00Z"}

AWS asks for a poll every 5 s. The endpoint is ``SOJOURN_IMDS_ENDPOINT`` (default
``http://169.254.169.254``), so tests point it at a local server that speaks the same.
"""

from __future__ import annotations

import os
import threading
import time

from sojourn.notices.base import Notice, PolledSource, Response, Unreachable, http, seconds_until

DEFAULT_ENDPOINT = "http://169.254.169.254"
TOKEN_TTL = 21600  # seconds; the most IMDS grants
INSTANCE_ACTION = "/latest/meta-data/spot/instance-action"
REBALANCE = "/latest/meta-data/events/recommendations/rebalance"


def endpoint() -> str:
    return os.environ.get("SOJOURN_IMDS_ENDPOINT", DEFAULT_ENDPOINT).rstrip("/")


class Imds:
    """IMDSv2 sessions: one token, renewed before it expires or when the service refuses it.
    Where IMDSv2 is switched off (the token call is not known), falls back to plain GETs."""

    def __init__(self, base: str | None = None, timeout: float = 2.0):
        self.base = (base or endpoint()).rstrip("/")
        self.timeout = timeout
        self._token: str | None = None
        self._expires = 0.0
        self._v1 = False
        self._lock = threading.Lock()

    def token(self, renew: bool = False) -> str | None:
        with self._lock:
            if self._v1:
                return None
            if renew or self._token is None or time.monotonic() >= self._expires:
                r = http("PUT", self.base + "/latest/api/token",
                         {"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL)}, timeout=self.timeout)
                if r.status in (403, 404, 405):
                    self._v1 = True  # IMDSv1 only (an old setup): no token to send
                    return None
                if r.status != 200 or not r.body:
                    raise Unreachable(f"IMDS token request at {self.base} answered {r.status}")
                self._token = r.text()
                self._expires = time.monotonic() + TOKEN_TTL * 0.9
            return self._token

    def get(self, path: str) -> Response:
        tok = self.token()
        headers = {"X-aws-ec2-metadata-token": tok} if tok else {}
        r = http("GET", self.base + path, headers, timeout=self.timeout)
        if r.status == 401 and tok:  # the token expired early (the service restarted): renew once
            tok = self.token(renew=True)
            r = http("GET", self.base + path, {"X-aws-ec2-metadata-token": tok} if tok else {}, timeout=self.timeout)
        return r


class SpotInstanceAction(PolledSource):
    name = "aws"

    def __init__(self, imds: Imds | None = None, interval: float = 5.0):
        self.imds = imds or Imds()
        self.interval = interval

    def poll(self) -> Notice | None:
        r = self.imds.get(INSTANCE_ACTION)
        if r.status == 404:
            return None
        if r.status != 200:
            raise Unreachable(f"GET {INSTANCE_ACTION} answered {r.status}: {r.text()[:200]}")
        doc = r.json()
        if not isinstance(doc, dict) or "action" not in doc:
            raise Unreachable(f"GET {INSTANCE_ACTION} answered an unknown document: {r.text()[:200]}")
        action = str(doc.get("action"))
        left = seconds_until(str(doc.get("time", "")))
        when = f" at {doc.get('time')}" if doc.get("time") else ""
        return Notice("aws", action, left, f"EC2 spot interruption: {action}{when}", doc)

    def describe(self) -> str:
        return f"aws spot instance-action ({self.imds.base})"


class RebalanceRecommendation(PolledSource):
    name = "aws-rebalance"

    def __init__(self, imds: Imds | None = None, interval: float = 5.0):
        self.imds = imds or Imds()
        self.interval = interval

    def poll(self) -> Notice | None:
        r = self.imds.get(REBALANCE)
        if r.status == 404:
            return None
        if r.status != 200:
            raise Unreachable(f"GET {REBALANCE} answered {r.status}: {r.text()[:200]}")
        doc = r.json()
        at = doc.get("noticeTime") if isinstance(doc, dict) else None
        # A recommendation says the risk went up, not when the machine goes: no deadline.
        return Notice("aws-rebalance", "rebalance", None,
                      f"EC2 rebalance recommendation{f' at {at}' if at else ''}", doc)

    def describe(self) -> str:
        return f"aws rebalance recommendation ({self.imds.base})"
