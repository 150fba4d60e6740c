"""Azure: Scheduled Events. A Spot VM about to be evicted gets a ``Preempt`` event (at
least 30 s ahead); a program that is ready acknowledges it, so that the platform goes on
without waiting for ``NotBefore``.

    GET  /metadata/scheduledevents?api-version=2020-07-01          Metadata: true
         -> {"DocumentIncarnation": 1, "Events": [{"EventId": "602d9444-...", "EventType": "Preempt",
             "ResourceType": "VirtualMachine", "Resources": ["vm1"], "EventStatus": "Scheduled",
             "NotBefore": "Mon, 19 Sep 2016 18:29:47 GMT", "Description": "", "EventSource": "Platform",
             "DurationInSeconds": -1}]}
    POST /metadata/scheduledevents?api-version=2020-07-01          Metadata: true
         {"StartRequests": [{"EventId": "602d9444-..."}]}

The first call after a VM starts may take up to two minutes (the service switches itself
on); it runs in the watcher's own thread, so nothing waits for it. Only ``Preempt`` events
for this VM become notices (``Reboot``, ``Redeploy``, ``Freeze`` are maintenance). We
acknowledge once the capsule is durable (:meth:`ScheduledEvents.acknowledge`, called when
the watcher stops). The endpoint is ``SOJOURN_AZURE_IMDS_ENDPOINT`` (default
``http://169.254.169.254``).
"""

from __future__ import annotations

import json
import os

from sojourn.notices.base import Notice, PolledSource, Unreachable, http, seconds_until

DEFAULT_ENDPOINT = "http://169.254.169.254"
PATH = "/metadata/scheduledevents?api-version=2020-07-01"
FIRST_CALL_S = 120.0
MIN_NOTICE_S = 30.0


def endpoint() -> str:
    return os.environ.get("SOJOURN_AZURE_IMDS_ENDPOINT", DEFAULT_ENDPOINT).rstrip("/")


class ScheduledEvents(PolledSource):
    name = "azure"

    def __init__(self, base: str | None = None, interval: float = 5.0, vm_name: str | None = None):
        self.base = (base or endpoint()).rstrip("/")
        self.interval = interval
        self.vm_name = vm_name  # None: any event (the service only lists this VM's and its set's)
        self.seen: set[str] = set()
        self.calls = 0

    def poll(self) -> Notice | None:
        self.calls += 1
        timeout = FIRST_CALL_S if self.calls == 1 else self.timeout + 3.0
        r = http("GET", self.base + PATH, {"Metadata": "true"}, timeout=timeout)
        if r.status != 200:
            raise Unreachable(f"GET {PATH} answered {r.status}: {r.text()[:200]}")
        doc = r.json()
        if not isinstance(doc, dict):
            raise Unreachable(f"scheduled events: not a JSON object: {r.text()[:200]}")
        for ev in doc.get("Events") or []:
            if ev.get("EventType") != "Preempt" or ev.get("EventId") in self.seen:
                continue
            if self.vm_name and self.vm_name not in (ev.get("Resources") or []):
                continue
            self.seen.add(str(ev.get("EventId")))
            left = seconds_until(str(ev.get("NotBefore") or ""))
            if left is None:  # "Started" events have no NotBefore: it is happening now
                left = 0.0 if ev.get("EventStatus") == "Started" else MIN_NOTICE_S
            return Notice("azure", "preempt", left,
                          f"Azure scheduled event Preempt {ev.get('EventId')} (not before {ev.get('NotBefore') or 'now'})",
                          {"DocumentIncarnation": doc.get("DocumentIncarnation"), "event": ev})
        return None

    def acknowledge(self, notice: Notice) -> None:
        event_id = (notice.payload or {}).get("event", {}).get("EventId")
        if not event_id:
            return
        body = json.dumps({"StartRequests": [{"EventId": event_id}]}).encode()
        r = http("POST", self.base + PATH, {"Metadata": "true", "Content-Type": "application/json"}, body,
                 timeout=self.timeout + 3.0)
        if r.status not in (200, 201, 202, 204):
            raise Unreachable(f"acknowledging event {event_id} answered {r.status}: {r.text()[:200]}")

    def describe(self) -> str:
        return f"azure scheduled events ({self.base})"
