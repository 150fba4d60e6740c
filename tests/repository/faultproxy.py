"""A TCP proxy between sojourn and the S3 server that fails on command: an outage (every
connection dropped before any answer), or answers of the server's own kind (503 SlowDown).
The server behind it is the real one; only the network between is made to fail."""

from __future__ import annotations

import select
import socket
import threading
import time
from dataclasses import dataclass, field

SLOW_DOWN = (
    b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
)
SLOW_DOWN_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)


@dataclass
class FaultProxy:
    target: tuple[str, int]
    mode: str = "up"  # "up", "down" (drop every connection), "slowdown" (answer 503), "slow" (a slow link)
    delay: float = 0.05  # "slow": seconds added to every piece forwarded
    dropped: int = 0
    refused: int = 0
    _sock: socket.socket | None = field(default=None, repr=False)
    _threads: list[threading.Thread] = field(default_factory=list, repr=False)
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)

    def start(self) -> str:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        s.settimeout(0.2)
        self._sock = s
        t = threading.Thread(target=self._accept, daemon=True)
        t.start()
        self._threads.append(t)
        return f"http://127.0.0.1:{s.getsockname()[1]}"

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=5)
        if self._sock is not None:
            self._sock.close()

    def _accept(self) -> None:
        assert self._sock is not None
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            t.start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            if self.mode == "down":
                self.dropped += 1
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                return  # closed with a reset, nothing answered
            if self.mode == "slowdown":
                self._read_request(conn)
                self.refused += 1
                conn.sendall(SLOW_DOWN % (len(SLOW_DOWN_BODY), SLOW_DOWN_BODY))
                return
            with socket.create_connection(self.target) as up:
                self._pipe(conn, up)

    def _read_request(self, conn: socket.socket) -> None:
        data = b""
        conn.settimeout(5)
        while b"\r\n\r\n" not in data:
            piece = conn.recv(65536)
            if not piece:
                return
            data += piece
        head, _, body = data.partition(b"\r\n\r\n")
        length = 0
        expect = False
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value.strip())
            if name.strip().lower() == b"expect":
                expect = True
        if expect:
            return  # the client waits for 100 Continue: a final answer now is valid HTTP
        while len(body) < length:
            piece = conn.recv(65536)
            if not piece:
                return
            body += piece

    def _pipe(self, a: socket.socket, b: socket.socket) -> None:
        socks = [a, b]
        while not self._stop.is_set():
            ready, _, _ = select.select(socks, [], [], 0.2)
            if self.mode not in ("up", "slow"):
                return  # a fault cuts connections already open too (a client's pooled one)
            for s in ready:
                try:
                    data = s.recv(1 << 16)
                except OSError:
                    return
                if not data:
                    return
                if self.mode == "slow":
                    time.sleep(self.delay)
                (b if s is a else a).sendall(data)
