"""The Approvals inbox: every pending request of the fleet (or of one batch), with exactly
what it would run, live over server-sent events; decisions go through the SDK (the CLI's
reply channel), bound to the sha256 shown, as the logged-in user; a refused decision says
who decided what."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from itertools import groupby

from markupsafe import Markup, escape
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from actfleet.broker.approvals import DecisionRefused
from actfleet.broker.connection import async_redis
from actfleet.broker.records import ApprovalRecord
from actfleet.client.sdk import Client
from actfleet.dashboard.auth import CSRF_COOKIE
from actfleet.dashboard.pages import check_write, page, templates, threaded
from actfleet.dashboard.render import request_html

LIVE_CHECK = 1.0
"""Seconds between checks of the pending set for new requests (decisions are published on
the `decided` channel and show at once)."""


def _pending(request: Request) -> list[ApprovalRecord]:
    """The pending requests the page shows: all, or the items of `?batch=`."""
    client: Client = request.app.state.client
    batch = request.query_params.get("batch", "").strip()
    return client.pending(batch=batch) if batch else client.pending()


def _inbox(request: Request, records: list[ApprovalRecord]) -> str:
    csrf = request.cookies.get(CSRF_COOKIE, "")
    read_only = request.app.state.read_only
    groups = [
        (session_id, list(items))
        for session_id, items in groupby(
            sorted(records, key=lambda r: (r.session_id, r.created_at)), key=lambda r: r.session_id
        )
    ]
    return templates.get_template("inbox.html").render(
        batch=request.query_params.get("batch", "").strip(),
        groups=groups,
        kinds=sorted({r.kind for r in records}),
        records=records,
        card=lambda r: Markup(request_html(r, read_only, csrf)),
        read_only=read_only,
        csrf_token=csrf,
    )


async def approvals_page(request: Request) -> Response:
    records = await threaded(_pending, request)
    batch = request.query_params.get("batch", "").strip()
    return page(request, "approvals.html", inbox=Markup(_inbox(request, records)), batch=batch)


async def approvals_list(request: Request) -> Response:
    """The inbox alone (the page's slow poll, a safety net under the live stream)."""
    return HTMLResponse(_inbox(request, await threaded(_pending, request)))


async def approvals_events(request: Request) -> Response:
    """The inbox, live: an `inbox` message (the whole inbox) at once, then whenever the
    pending set changes: at once on a decision (the `decided` channel), within `LIVE_CHECK`
    for a new request (the pending sorted set, compared by ids only)."""
    client: Client = request.app.state.client

    async def stream() -> AsyncIterator[ServerSentEvent]:
        conn = async_redis(client.settings)
        pubsub = conn.pubsub()
        await pubsub.subscribe(client.keys.decided())
        try:
            shown = None
            while True:
                ids = await conn.zrange(client.keys.approvals(), 0, -1)
                if ids != shown:
                    shown = ids
                    html = _inbox(request, await threaded(_pending, request))
                    yield ServerSentEvent(event="inbox", data=json.dumps({"html": html}))
                await pubsub.get_message(ignore_subscribe_messages=True, timeout=LIVE_CHECK)
        finally:
            await pubsub.aclose()
            await conn.aclose()

    return EventSourceResponse(stream(), ping=15)


def decide(client: Client, request_id: str, sha: str, approve: bool, user: str, reason: str) -> str:
    """Decide one request; DecisionRefused (saying who decided what) when it is refused."""
    if approve:
        record = client.approve(request_id, args_sha256=sha, approver=user, reason=reason)
    else:
        record = client.reject(request_id, args_sha256=sha, approver=user, reason=reason)
    return f"{record.id} {record.status} by {record.approver}"


async def decide_one(request: Request) -> Response:
    user = await check_write(request)
    form = await request.form()
    verdict = str(form.get("decision", ""))
    if verdict not in ("approve", "reject"):
        raise HTTPException(400, "decision must be approve or reject")
    reason = str(form.get("reason", "") or request.headers.get("hx-prompt", ""))
    args = (request.path_params["request_id"], str(form.get("sha256", "")), verdict == "approve")
    try:
        message = await threaded(decide, request.app.state.client, *args, user, reason)
    except DecisionRefused as exc:
        return HTMLResponse(f'<p class="refused">{escape(str(exc))}</p>', status_code=409)
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from None
    return HTMLResponse(f'<p class="decided">{escape(message)}</p>')


async def approve_all(request: Request) -> Response:
    """Approve the requests the page showed (each `request` field is `id:sha256`)."""
    user = await check_write(request)
    form = await request.form()
    lines = []
    for item in form.getlist("request"):
        request_id, _, sha = str(item).partition(":")
        try:
            lines.append(
                await threaded(decide, request.app.state.client, request_id, sha, True, user, "")
            )
        except (DecisionRefused, ValueError) as exc:
            lines.append(str(exc))
    items = "".join(f"<li>{escape(line)}</li>" for line in lines)
    return HTMLResponse(f'<ul class="decided">{items}</ul>')
