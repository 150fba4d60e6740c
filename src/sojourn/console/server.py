"""Serving the console: uvicorn on 127.0.0.1 (by default), the URL with its token printed
(and opened in a browser unless told not to)."""

from __future__ import annotations

import socket
import sys
import threading
import webbrowser
from typing import Any

from sojourn.errors import SojournError


def missing_extra() -> SojournError:
    return SojournError("the console needs its libraries: pip install 'sojourn[console]'")


def serve(repo: str | None = None, *, host: str = "127.0.0.1", port: int = 8765, open_browser: bool = True,
          token: str | None = None, announce: Any = None) -> None:
    """Serve until interrupted. ``port`` 0 picks a free one."""
    try:
        import uvicorn

        from sojourn.console.app import create_app
        from sojourn.console.security import LOOPBACK
    except ImportError as e:
        raise missing_extra() from e
    hosts = LOOPBACK | {host.lower()} if host not in ("0.0.0.0", "::") else LOOPBACK | {socket.gethostname().lower()}
    app, console = create_app(repo, token, frozenset(hosts))
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        raise SojournError(f"cannot listen on {host}:{port} ({e.strerror}): pick another with --port") from e
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else (f"[{host}]" if ":" in host else host)
    url = f"http://{shown}:{sock.getsockname()[1]}/?token={console.token}"
    (announce or (lambda s: print(s, file=sys.stderr, flush=True)))(
        f"sojourn console: {url}\n(open it in a browser; the token keeps others out; Ctrl-C stops)")
    if open_browser:
        threading.Timer(0.5, webbrowser.open, (url,)).start()
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2, lifespan="off")
    uvicorn.Server(config).run(sockets=[sock])
