"""The console's Starlette application: pages (GET) and actions (POST, each behind a
confirmation page and the CSRF token). Everything it shows or does goes through ``ops``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.templating import Jinja2Templates

from sojourn.console import actions, charts, views
from sojourn.console.security import LOOPBACK, Guard, csrf_for, new_token, same
from sojourn.errors import SojournError

TEMPLATES = Path(__file__).parent / "templates"
POLL_S = 0.5  # how often the live log looks for new output


class Console:
    """One console: the repository it shows (None: the default one) and its token."""

    def __init__(self, repo: str | None = None, token: str | None = None):
        self.repo = repo
        self.token = token or new_token()
        self.csrf = csrf_for(self.token)
        self.templates = Jinja2Templates(directory=str(TEMPLATES))
        env = self.templates.env
        env.filters.update(size=charts.size, duration=charts.duration, when=charts.when, q=lambda s: quote(str(s), safe=""))
        env.globals.update(csrf=self.csrf, repo=repo or "the default repository", actions=actions.ACTIONS, available=actions.available)

    def page(self, request: Request, template: str, status: int = 200, **ctx: Any) -> Response:
        return self.templates.TemplateResponse(request, template, ctx, status_code=status)

    async def read(self, request: Request, template: str, fn: Callable[[], dict[str, Any]]) -> Response:
        """A page whose data comes from ``ops`` (in a worker thread: ops calls block)."""
        try:
            data = await run_in_threadpool(fn)
        except SojournError as e:
            return self.page(request, "error.html", 404 if "no workspace" in str(e) else 400, message=str(e))
        return self.page(request, template, **data)

    # -- pages -------------------------------------------------------------------------

    async def index(self, request: Request) -> Response:
        return await self.read(request, "index.html", lambda: views.workspaces(self.repo))

    async def workspace(self, request: Request) -> Response:
        ws = request.path_params["ws"]
        return await self.read(request, "workspace.html",
                               lambda: {**views.workspace(ws, self.repo), "done": request.query_params.get("done")})

    async def capsule(self, request: Request) -> Response:
        return await self.read(request, "capsule.html", lambda: views.capsule(request.path_params["cap"], self.repo))

    async def diff(self, request: Request) -> Response:
        a, b = request.query_params.get("a", ""), request.query_params.get("b", "")
        if not a or not b:
            return self.page(request, "error.html", 400, message="pick two capsules to compare")
        return await self.read(request, "diff.html", lambda: views.diff(a, b, self.repo))

    async def offers(self, request: Request) -> Response:
        ws = request.query_params.get("workspace")
        return await self.read(request, "offers.html", lambda: views.offers(self.repo, ws))

    async def plan(self, request: Request) -> Response:
        q = request.query_params
        ws, to = q.get("workspace", ""), q.get("to", "")
        if not ws or not to:
            return self.page(request, "error.html", 400, message="a plan needs a workspace and an offer (provider:name)")
        return await self.read(request, "plan.html", lambda: views.plan(ws, to, self.repo, q.get("remaining")))

    async def confirm(self, request: Request) -> Response:
        ws, name = request.path_params["ws"], request.path_params["action"]
        if name not in actions.ACTIONS:
            raise HTTPException(404, f"no action {name}")
        return await self.read(request, "confirm.html",
                               lambda: {**views.workspace(ws, self.repo), "action": actions.ACTIONS[name], "name": name})

    async def logs(self, request: Request) -> Response:
        """The workspace's log as server-sent events (every record so far, then each new one
        while it runs); an ``end`` event says it stopped running."""
        ws = request.path_params["ws"]
        from sojourn import ops

        async def events() -> AsyncIterator[str]:
            # Polled (each read a short call in a worker thread) rather than a blocking
            # follow: a silent program must not hold a thread after the page is closed.
            sent = 0
            try:
                while True:
                    log = await run_in_threadpool(ops.logs, ws, repo=self.repo)
                    for r in log.records[sent:]:
                        yield f"event: log\ndata: {json.dumps({'stream': r.stream, 'text': r.text, 'allocation': r.allocation})}\n\n"
                    sent = len(log.records)
                    if log.state != "running":
                        yield f"event: end\ndata: {json.dumps({'state': log.state})}\n\n"
                        return
                    if await request.is_disconnected():
                        return
                    await asyncio.sleep(POLL_S)
            except SojournError as e:
                yield f"event: failure\ndata: {json.dumps({'message': str(e)})}\n\n"

        return StreamingResponse(events(), media_type="text/event-stream", headers={"cache-control": "no-store"})

    # -- actions -----------------------------------------------------------------------

    async def act(self, request: Request) -> Response:
        ws, name = request.path_params["ws"], request.path_params["action"]
        if name not in actions.ACTIONS:
            raise HTTPException(404, f"no action {name}")
        form = await request.form()
        if not same(str(form.get("csrf", "")) or None, self.csrf):
            return Response("refused: the form's CSRF token is missing or wrong; reload the page and try again",
                            status_code=403, media_type="text/plain")
        origin = request.headers.get("origin")
        if origin is not None and origin != f"{request.url.scheme}://{request.headers.get('host')}":
            return Response("refused: the request came from another site", status_code=403, media_type="text/plain")
        fields = {k: str(v) for k, v in form.items() if k != "csrf"}
        try:
            outcome = await run_in_threadpool(actions.ACTIONS[name].do, ws, self.repo, fields)
        except SojournError as e:
            return self.page(request, "error.html", 409, message=str(e), back=f"/w/{quote(ws, safe='')}")
        return RedirectResponse(f"/w/{quote(outcome.workspace, safe='')}?done={quote(outcome.message)}", status_code=303)

    def routes(self) -> list[Route]:
        return [Route("/", self.index), Route("/w/{ws}", self.workspace), Route("/w/{ws}/logs", self.logs),
                Route("/w/{ws}/confirm/{action}", self.confirm), Route("/w/{ws}/do/{action}", self.act, methods=["POST"]),
                Route("/capsule/{cap}", self.capsule), Route("/diff", self.diff), Route("/offers", self.offers),
                Route("/plan", self.plan)]


def create_app(repo: str | None = None, token: str | None = None,
               hosts: frozenset[str] = LOOPBACK) -> tuple[Any, Console]:
    """The guarded ASGI application and its console (whose ``token`` opens it)."""
    c = Console(repo, token)
    app = Starlette(routes=c.routes())
    return Guard(app, c.token, hosts), c

