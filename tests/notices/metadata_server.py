"""A local stand-in for the clouds' metadata services, speaking their real protocols and
payloads (the clouds themselves cannot be reached from a test):

* AWS IMDSv2: ``PUT /latest/api/token`` (needs ``X-aws-ec2-metadata-token-ttl-seconds``,
  1..21600), then GETs with ``X-aws-ec2-metadata-token`` (401 without a valid token, as on an
  instance that requires IMDSv2); ``spot/instance-action`` and
  ``events/recommendations/rebalance`` answer 404 until a notice is set.
* GCE: ``/computeMetadata/v1/instance/preempted`` (403 without ``Metadata-Flavor: Google``),
  ``FALSE``/``TRUE`` with an ETag; ``wait_for_change=true`` hangs until the value's ETag
  differs from ``last_etag`` or ``timeout_sec`` passes.
* Azure: ``/metadata/scheduledevents?api-version=2020-07-01`` (400 without ``Metadata: true``
  or without an api-version); POST ``{"StartRequests": [{"EventId": ...}]}`` acknowledges.

Flip it with :meth:`MetadataServer.aws_notice`, :meth:`gcp_preempt`, :meth:`azure_preempt`.
Run alone (``python -m tests.notices.metadata_server``) it serves on a free port and prints it.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

AWS_404 = (b'<?xml version="1.0" encoding="iso-8859-1"?>\n<!DOCTYPE html>\n<html><head><title>404 - Not Found'
           b'</title></head><body><h1>404 - Not Found</h1></body></html>\n')


def iso_in(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + seconds))


class MetadataServer:
    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        self.lock = threading.Condition()
        self.instance_action: dict[str, Any] | None = None
        self.rebalance: dict[str, Any] | None = None
        self.preempted = False
        self.gcp_etag = uuid.uuid4().hex[:16]
        self.azure_doc: dict[str, Any] = {"DocumentIncarnation": 0, "Events": []}
        self.azure_acks: list[str] = []
        self.tokens: dict[str, float] = {}
        self.requests: list[tuple[str, str]] = []
        self.flipped_at: float | None = None
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_PUT(self) -> None:
                server.handle(self, "PUT")

            def do_GET(self) -> None:
                server.handle(self, "GET")

            def do_POST(self) -> None:
                server.handle(self, "POST")

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://{host}:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def start(self) -> MetadataServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        with self.lock:
            self.lock.notify_all()
        self.httpd.shutdown()
        self.httpd.server_close()

    # -- flipping ------------------------------------------------------------------------

    def aws_notice(self, action: str = "terminate", in_seconds: float = 120.0) -> None:
        with self.lock:
            self.flipped_at = time.time()
            self.instance_action = {"action": action, "time": iso_in(in_seconds)}

    def aws_rebalance(self) -> None:
        with self.lock:
            self.flipped_at = time.time()
            self.rebalance = {"noticeTime": iso_in(0)}

    def gcp_preempt(self) -> None:
        with self.lock:
            self.flipped_at = time.time()
            self.preempted = True
            self.gcp_etag = uuid.uuid4().hex[:16]
            self.lock.notify_all()

    def azure_preempt(self, in_seconds: float = 30.0, resources: list[str] | None = None) -> str:
        event_id = str(uuid.uuid4()).upper()
        with self.lock:
            self.flipped_at = time.time()
            self.azure_doc = {
                "DocumentIncarnation": self.azure_doc["DocumentIncarnation"] + 1,
                "Events": [*self.azure_doc["Events"], {
                    "EventId": event_id, "EventStatus": "Scheduled", "EventType": "Preempt",
                    "ResourceType": "VirtualMachine", "Resources": resources or ["sojourn-vm"],
                    "NotBefore": formatdate(time.time() + in_seconds, usegmt=True), "Description": "",
                    "EventSource": "Platform", "DurationInSeconds": -1}],
            }
        return event_id

    def azure_event(self, event_type: str) -> str:
        """A maintenance event that must not become a notice."""
        event_id = str(uuid.uuid4()).upper()
        with self.lock:
            self.azure_doc = {
                "DocumentIncarnation": self.azure_doc["DocumentIncarnation"] + 1,
                "Events": [*self.azure_doc["Events"], {
                    "EventId": event_id, "EventStatus": "Scheduled", "EventType": event_type,
                    "ResourceType": "VirtualMachine", "Resources": ["sojourn-vm"],
                    "NotBefore": formatdate(time.time() + 600, usegmt=True), "Description": "Host maintenance",
                    "EventSource": "Platform", "DurationInSeconds": 9}],
            }
        return event_id

    # -- serving -------------------------------------------------------------------------

    def handle(self, h: BaseHTTPRequestHandler, method: str) -> None:
        parts = urlsplit(h.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else b""
        with self.lock:
            self.requests.append((method, h.path))
        path = parts.path
        if path.startswith("/latest/"):
            self._aws(h, method, path)
        elif path.startswith("/computeMetadata/"):
            self._gcp(h, path, query)
        elif path.startswith("/metadata/"):
            self._azure(h, method, path, query, body)
        else:
            self._send(h, 404, b"not found")

    def _send(self, h: BaseHTTPRequestHandler, status: int, body: bytes, ctype: str = "text/plain",
              extra: dict[str, str] | None = None) -> None:
        try:
            h.send_response(status)
            h.send_header("Content-Type", ctype)
            h.send_header("Content-Length", str(len(body)))
            for k, v in (extra or {}).items():
                h.send_header(k, v)
            h.end_headers()
            h.wfile.write(body)
        except OSError:
            pass  # the client gave up (a watcher that was stopped)

    def _aws(self, h: BaseHTTPRequestHandler, method: str, path: str) -> None:
        if path == "/latest/api/token":
            ttl = h.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
            if method != "PUT":
                return self._send(h, 405, b"")
            if not ttl or not ttl.isdigit() or not 1 <= int(ttl) <= 21600:
                return self._send(h, 400, b"")
            tok = uuid.uuid4().hex + uuid.uuid4().hex
            with self.lock:
                self.tokens[tok] = time.time() + int(ttl)
            return self._send(h, 200, tok.encode(), extra={"X-Aws-Ec2-Metadata-Token-Ttl-Seconds": ttl})
        tok = h.headers.get("X-aws-ec2-metadata-token")
        with self.lock:
            valid = tok is not None and self.tokens.get(tok, 0) > time.time()
            doc = {"/latest/meta-data/spot/instance-action": self.instance_action,
                   "/latest/meta-data/events/recommendations/rebalance": self.rebalance}.get(path)
        if not valid:
            return self._send(h, 401, b"")
        if doc is None:
            return self._send(h, 404, AWS_404, "text/html")
        return self._send(h, 200, json.dumps(doc).encode(), "text/plain")

    def _gcp(self, h: BaseHTTPRequestHandler, path: str, query: dict[str, str]) -> None:
        if h.headers.get("Metadata-Flavor") != "Google" or h.headers.get("X-Forwarded-For"):
            return self._send(h, 403, b"Missing Metadata-Flavor:Google header.", extra={"Metadata-Flavor": "Google"})
        if path != "/computeMetadata/v1/instance/preempted":
            return self._send(h, 404, b"not found", extra={"Metadata-Flavor": "Google"})
        if query.get("wait_for_change") == "true":
            last = query.get("last_etag")
            end = time.monotonic() + float(query.get("timeout_sec", 300))
            with self.lock:
                while (last is None or last == self.gcp_etag) and time.monotonic() < end:
                    # Without an ETag the server waits for the next change.
                    seen = self.gcp_etag
                    self.lock.wait(min(0.5, max(0.0, end - time.monotonic())))
                    if last is None and self.gcp_etag != seen:
                        break
                    if not self.thread.is_alive():
                        break
        with self.lock:
            value, etag = ("TRUE" if self.preempted else "FALSE"), self.gcp_etag
        self._send(h, 200, value.encode(), "application/text", {"ETag": etag, "Metadata-Flavor": "Google"})

    def _azure(self, h: BaseHTTPRequestHandler, method: str, path: str, query: dict[str, str], body: bytes) -> None:
        if h.headers.get("Metadata") != "true":
            return self._send(h, 400, json.dumps({"error": "Bad request. Required metadata header not specified"}).encode(),
                              "application/json")
        if path != "/metadata/scheduledevents" or not query.get("api-version"):
            return self._send(h, 400, json.dumps({"error": "Bad request. api-version was not specified"}).encode(),
                              "application/json")
        if method == "POST":
            try:
                ids = [r["EventId"] for r in json.loads(body)["StartRequests"]]
            except (ValueError, KeyError, TypeError):
                return self._send(h, 400, b'{"error": "Bad request"}', "application/json")
            with self.lock:
                self.azure_acks += ids
                events = [e for e in self.azure_doc["Events"] if e["EventId"] not in ids]
                self.azure_doc = {"DocumentIncarnation": self.azure_doc["DocumentIncarnation"] + 1, "Events": events}
            return self._send(h, 200, b"", "application/json")
        with self.lock:
            doc = json.dumps(self.azure_doc).encode()
        self._send(h, 200, doc, "application/json")


if __name__ == "__main__":
    srv = MetadataServer().start()
    print(srv.url, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        srv.stop()
