"""The console's guards, like Jupyter's: a random token (given once in the printed URL, then
kept in a cookie), a Host check against DNS rebinding, and a CSRF token on every POST.

A page of the console can suspend or move a program and spend money, so every request must
come from the person who started it: another local user, or a web page in their browser,
must not be able to drive it."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import parse_qsl, urlencode

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]

COOKIE = "sojourn_console"
LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})


def new_token() -> str:
    return secrets.token_hex(24)


def csrf_for(token: str) -> str:
    """The form token: derived from the session token, so that a page that cannot read the
    cookie cannot forge it either."""
    return hmac.new(token.encode(), b"sojourn-console-csrf", hashlib.sha256).hexdigest()


def same(a: str | None, b: str) -> bool:
    return a is not None and hmac.compare_digest(a.encode(), b.encode())


def host_of(header: str) -> str:
    """The host name of a Host header, without its port (IPv6 literals keep no brackets)."""
    h = header.strip().lower()
    if h.startswith("["):
        return h[1:h.find("]")] if "]" in h else h
    return h.rsplit(":", 1)[0] if h.count(":") == 1 else h


class Guard:
    """ASGI middleware: refuses (403) a request with a foreign Host header or without the
    token; a request carrying ``?token=`` gets the cookie and is sent on without it."""

    def __init__(self, app: ASGIApp, token: str, hosts: frozenset[str] = LOOPBACK):
        self.app, self.token, self.hosts = app, token, hosts

    async def __call__(self, scope: Scope, receive: Callable[[], Awaitable[Any]],
                       send: Callable[[Any], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        if host_of(headers.get("host", "")) not in self.hosts:
            await _refuse(send, "this console answers only to its own address (the Host header names another): "
                                "open the URL `sojourn console` printed")
            return
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        given = dict(query).get("token")
        if given is not None:
            if not same(given, self.token):
                await _refuse(send, "wrong token: open the URL `sojourn console` printed")
                return
            rest = urlencode([(k, v) for k, v in query if k != "token"])
            await _redirect(send, scope["path"] + (f"?{rest}" if rest else ""), self.token)
            return
        cookie = SimpleCookie(headers.get("cookie", ""))
        if COOKIE not in cookie or not same(cookie[COOKIE].value, self.token):
            await _refuse(send, "no token: open the URL `sojourn console` printed (it ends in ?token=...)")
            return
        await self.app(scope, receive, send)


async def _refuse(send: Callable[[Any], Awaitable[None]], message: str) -> None:
    body = message.encode()
    await send({"type": "http.response.start", "status": 403,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def _redirect(send: Callable[[Any], Awaitable[None]], location: str, token: str) -> None:
    cookie = f"{COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict"
    await send({"type": "http.response.start", "status": 303,
                "headers": [(b"location", location.encode()), (b"set-cookie", cookie.encode()),
                            (b"content-length", b"0")]})
    await send({"type": "http.response.body", "body": b""})
