"""The dashboard's Starlette app: routes, the auth gate every request passes, and `serve`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from actfleet.client.sdk import Client
from actfleet.dashboard.approvals import (
    approvals_events,
    approvals_list,
    approvals_page,
    approve_all,
    decide_one,
)
from actfleet.dashboard.auth import SESSION_COOKIE, Auth
from actfleet.dashboard.batches import (
    batch_events,
    batch_page,
    batch_results,
    batches_page,
    cancel_batch,
)
from actfleet.dashboard.fleet import fleet_page
from actfleet.dashboard.pages import page
from actfleet.dashboard.render import highlight_css
from actfleet.dashboard.session import (
    cancel_session,
    full_output,
    image,
    send_prompt,
    session_events,
    session_page,
)
from actfleet.dashboard.sessions import sessions_page

STATIC = Path(__file__).parent / "static"


@dataclass(frozen=True)
class DashboardConfig:
    auth: Auth
    read_only: bool = False
    flower_url: str = ""


class AuthGate:
    """Every request but the login form's needs a user when auth is on: 401 otherwise
    (with a login form for a browser on a token-protected dashboard)."""

    def __init__(self, app: ASGIApp, auth: Auth) -> None:
        self.app, self.auth = app, auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        user = self.auth.user(request)
        if user is None and not (scope["path"] == "/login" and request.method == "POST"):
            await _unauthorized(self.auth)(scope, receive, send)
            return
        scope["user_name"] = user or ""
        await self.app(scope, receive, send)


def _unauthorized(auth: Auth) -> Response:
    headers = {"www-authenticate": 'Basic realm="actfleet"'} if auth.users else {}
    form = (
        '<form method="post" action="/login"><label>Dashboard token '
        '<input type="password" name="token" autofocus></label> <button>Log in</button></form>'
        if auth.token
        else ""
    )
    body = f"<!doctype html><title>actfleet: log in</title><h1>401: log in</h1>{form}"
    return HTMLResponse(body, status_code=401, headers=headers)


async def login(request: Request) -> Response:
    auth: Auth = request.app.state.auth
    value = auth.login(str((await request.form()).get("token", "")))
    if value is None:
        return _unauthorized(auth)
    response = RedirectResponse("/", status_code=303)
    response.set_cookie(SESSION_COOKIE, value, httponly=True, samesite="strict", path="/")
    return response


async def css(request: Request) -> Response:
    return PlainTextResponse(highlight_css, media_type="text/css")


async def error_page(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if request.headers.get("hx-request") or "text/html" not in request.headers.get("accept", ""):
        return PlainTextResponse(exc.detail, status_code=exc.status_code)
    return page(request, "error.html", status_code=exc.status_code, error=exc.detail)


def create_app(client: Client, config: DashboardConfig) -> Starlette:
    routes = [
        Route("/", fleet_page),
        Route("/login", login, methods=["POST"]),
        Route("/sessions", sessions_page),
        Route("/sessions/{session_id}", session_page),
        Route("/sessions/{session_id}/events", session_events),
        Route("/sessions/{session_id}/cancel", cancel_session, methods=["POST"]),
        Route("/sessions/{session_id}/prompt", send_prompt, methods=["POST"]),
        Route("/outputs/{ref:path}", full_output),
        Route("/images/{name}", image),
        Route("/batches", batches_page),
        Route("/batches/{batch_id}", batch_page),
        Route("/batches/{batch_id}/events", batch_events),
        Route("/batches/{batch_id}/results.jsonl", batch_results),
        Route("/batches/{batch_id}/cancel", cancel_batch, methods=["POST"]),
        Route("/approvals", approvals_page),
        Route("/approvals/list", approvals_list),
        Route("/approvals/events", approvals_events),
        Route("/approvals/approve-all", approve_all, methods=["POST"]),
        Route("/approvals/{request_id}/decide", decide_one, methods=["POST"]),
        Route("/highlight.css", css),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(AuthGate, auth=config.auth)],
        exception_handlers={HTTPException: error_page},
    )
    app.state.client = client
    app.state.auth = config.auth
    app.state.read_only = config.read_only
    app.state.flower_url = config.flower_url
    return app


def serve(client: Client, config: DashboardConfig, host: str, port: int) -> None:
    """Run the dashboard in the foreground (uvicorn)."""
    import uvicorn

    uvicorn.run(create_app(client, config), host=host, port=port, log_level="info")
