"""The control channel between a kernel process and its provisioner: JSON lines over a Unix
socket that the provisioner listens on (``$SOJOURN_KERNEL_CONTROL``).

Why not the Jupyter channels: the kernel's shell/control sockets belong to the notebook's
clients, and a move has to talk while those are being handed from one process to another.
A Unix socket in a private directory (mode 0700) is reachable only by the user who runs the
server, and each connection is one conversation (a move, a destination's hello).
"""

from __future__ import annotations

import base64
import json
import os
import select
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

ENV = "SOJOURN_KERNEL_CONTROL"


class Channel:
    """One connection: send and receive JSON documents, one per line."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self._buf = bytearray()

    def send(self, doc: dict[str, Any]) -> None:
        self.sock.settimeout(None)
        self.sock.sendall(json.dumps(doc, separators=(",", ":")).encode() + b"\n")

    def recv(self, timeout: float | None = None) -> dict[str, Any]:
        """The next document; ``EOFError`` when the other side closed, ``TimeoutError`` when
        nothing came in ``timeout`` seconds (the channel stays usable: a caller may poll)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self.sock], [], [], left)
            if not ready:
                raise TimeoutError("the other side of the kernel control channel did not answer in time")
            data = self.sock.recv(1 << 16)
            if not data:
                raise EOFError("the kernel control channel was closed")
            self._buf += data
        i = self._buf.index(b"\n")
        line = bytes(self._buf[:i])
        del self._buf[: i + 1]
        doc = json.loads(line)
        if not isinstance(doc, dict):
            raise ValueError("a control message must be a JSON object")
        return doc

    def close(self) -> None:
        self.sock.close()


def connect(path: str | None = None, timeout: float = 10.0) -> Channel:
    path = path or os.environ.get(ENV)
    if not path:
        raise ConnectionError(
            "this kernel was not started by the sojourn kernel provisioner, so it cannot move "
            "or suspend itself; start the notebook on the 'sojourn' kernel "
            "(python -m sojourn.notebook install) and run it again")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(path)
    except OSError as e:
        s.close()
        raise ConnectionError(f"the kernel provisioner does not answer at {path} ({e}); the "
                              "Jupyter server that started this kernel may be gone") from None
    return Channel(s)


class Server:
    """Listens on ``path``; every connection is served by ``handler(channel)`` on its own
    thread (a move waits for minutes on a restore, a hello waits for its go)."""

    def __init__(self, path: str, handler: Callable[[Channel], None]):
        self.path = path
        self.handler = handler
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        os.chmod(path, 0o600)
        self.sock.listen(16)
        self._closed = False
        self.thread = threading.Thread(target=self._accept, name="sojourn-control", daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), name="sojourn-control-conn", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        ch = Channel(conn)
        try:
            self.handler(ch)
        except Exception:
            pass  # the handler reports to its peer; a broken peer must not take the server down
        finally:
            ch.close()

    def close(self) -> None:
        self._closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass


def pack_frames(frames: list[bytes]) -> list[str]:
    return [base64.b64encode(f).decode() for f in frames]


def unpack_frames(frames: list[str]) -> list[bytes]:
    return [base64.b64decode(f) for f in frames]
