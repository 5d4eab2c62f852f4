"""What every page shares: templates, the CSRF cookie, running the sync SDK off the loop,
and the checks a state change passes (read-only mode, CSRF)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse

from actfleet.dashboard.auth import CSRF_COOKIE, CSRF_FIELD, CSRF_HEADER, csrf_ok, new_csrf_token

T = TypeVar("T")

NAV = [
    ("Fleet", "/"),
    ("Sessions", "/sessions"),
    ("Batches", "/batches"),
    ("Approvals", "/approvals"),
]
"""The pages in the navigation bar, in order; a page is added by adding it here."""

templates = Environment(
    loader=FileSystemLoader(Path(__file__).parent / "templates"),
    autoescape=select_autoescape(["html"]),
)
templates.filters["ago"] = lambda ts: _ago(time.time() - float(ts)) if ts else "-"
templates.filters["until"] = lambda ts: _ago(max(0.0, float(ts) - time.time()))
templates.filters["duration"] = lambda seconds: _ago(float(seconds))
# A replay model by its file's name (the page shows the whole path as the cell's title).
templates.filters["short_model"] = lambda model: (
    "replay:" + model.rsplit("/", 1)[-1] if model.startswith("replay:") else model
)


def cost_text(usage: Mapping[str, Any]) -> str:
    """A cost as pages show it, from usage that may report one: "$0.0123"; a lower bound
    ("≥ $0.0123") when some model requests had no known price (`unpriced`); "unknown"
    when none had one (never $0 for unknown); "" when the usage reports no cost at all."""
    if "cost" not in usage:
        return ""
    cost = usage["cost"]
    unpriced, requests = (
        int(float(usage.get("unpriced") or 0)),
        int(float(usage.get("requests") or 0)),
    )
    if cost is None or cost == "" or (requests and unpriced >= requests):
        return "unknown"
    return ("≥ " if unpriced else "") + f"${float(cost):.4f}"


templates.filters["cost"] = cost_text


def _ago(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


async def threaded(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a sync SDK call in a worker thread (the SDK's Client is sync)."""
    return await run_in_threadpool(fn, *args, **kwargs)


def page(request: Request, template: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    """A rendered page; sets the CSRF cookie its forms submit back."""
    csrf = request.cookies.get(CSRF_COOKIE) or new_csrf_token()
    state = request.app.state
    html = templates.get_template(template).render(
        request=request,
        nav=NAV,
        user=request.scope.get("user_name", ""),
        read_only=state.read_only,
        flower_url=state.flower_url,
        csrf_token=csrf,
        **context,
    )
    response = HTMLResponse(html, status_code=status_code)
    if CSRF_COOKIE not in request.cookies:
        response.set_cookie(CSRF_COOKIE, csrf, httponly=True, samesite="strict", path="/")
    return response


async def check_write(request: Request) -> str:
    """The user a state change is made as; 403 in read-only mode or without the CSRF token."""
    if request.app.state.read_only:
        raise HTTPException(
            403, "this dashboard is read-only (--read-only): no decisions, no cancel"
        )
    form = await request.form()
    submitted = request.headers.get(CSRF_HEADER) or str(form.get(CSRF_FIELD, ""))
    if not csrf_ok(request, submitted):
        raise HTTPException(
            403, "CSRF check failed: reload the page and try again (the form's token must match)"
        )
    return str(request.scope.get("user_name", ""))
