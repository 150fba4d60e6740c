"""Google Compute Engine: a Spot or preemptible VM learns it is being preempted from the
metadata server, about 30 s before it is stopped (ACPI soft off, then hard off).

    GET /computeMetadata/v1/instance/preempted                   Metadata-Flavor: Google
        -> "FALSE" (ETag: e1)
    GET /computeMetadata/v1/instance/preempted?wait_for_change=true&last_etag=e1&timeout_sec=60
        -> hangs until the value changes (or the timeout), then "TRUE" (ETag: e2)

The first request reads the value and its ETag; later ones long-poll from that ETag, so a
preemption is seen as soon as the server flips it, with one request a minute while nothing
happens. The endpoint is ``SOJOURN_GCE_METADATA_ENDPOINT`` (default
``http://metadata.google.internal``; ``GCE_METADATA_HOST``, which Google's libraries read,
is honoured too).
"""

from __future__ import annotations

import os

from sojourn.notices.base import Notice, PolledSource, Unreachable, http

DEFAULT_ENDPOINT = "http://metadata.google.internal"
PATH = "/computeMetadata/v1/instance/preempted"
NOTICE_S = 30.0  # Spot and preemptible VMs: 30 s from the notice to the hard stop
HANG_S = 60  # how long one long-poll waits on the server


def endpoint() -> str:
    explicit = os.environ.get("SOJOURN_GCE_METADATA_ENDPOINT")
    if explicit:
        return explicit.rstrip("/")
    host = os.environ.get("GCE_METADATA_HOST")
    return f"http://{host}" if host else DEFAULT_ENDPOINT


class Preempted(PolledSource):
    name = "gcp"

    def __init__(self, base: str | None = None, interval: float = 1.0, hang: int = HANG_S):
        self.base = (base or endpoint()).rstrip("/")
        self.interval = interval  # between long-polls (each of which waits up to `hang` s)
        self.hang = hang
        self.etag: str | None = None

    def poll(self) -> Notice | None:
        url = self.base + PATH
        timeout = self.timeout
        if self.etag is not None:
            url += f"?wait_for_change=true&last_etag={self.etag}&timeout_sec={self.hang}"
            timeout = self.hang + 5.0
        r = http("GET", url, {"Metadata-Flavor": "Google"}, timeout=timeout)
        if r.status != 200:
            self.etag = None  # read the value again, without waiting, next time
            raise Unreachable(f"GET {url} answered {r.status}: {r.text()[:200]}")
        if r.headers.get("metadata-flavor", "Google") != "Google":
            raise Unreachable(f"{self.base} is not a GCE metadata server (no Metadata-Flavor: Google)")
        self.etag = r.headers.get("etag") or None
        if r.text().upper() != "TRUE":
            return None
        return Notice("gcp", "preempt", NOTICE_S, "GCE preemption: instance/preempted is TRUE", r.text())

    def describe(self) -> str:
        return f"gcp instance/preempted ({self.base})"
