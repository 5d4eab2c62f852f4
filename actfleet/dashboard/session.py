"""The Session page: the session's events live over server-sent events, each SSE `id` its
stream id, so a reconnect (`Last-Event-ID`) resumes with nothing missed or repeated; a full
output on demand; images; cancel and a follow-up prompt."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator

from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response

from actfleet.broker.events import TurnStarted
from actfleet.broker.ids import check_id
from actfleet.broker.stream import entries_to_events
from actfleet.broker.transitions import text
from actfleet.client.sdk import STREAM_ID, Client, UnknownSession
from actfleet.dashboard.pages import check_write, page, threaded
from actfleet.dashboard.render import CHUNKS, chunk_key, chunk_text, event_html

IMAGE_NAME = re.compile(r"[0-9a-f]{64}\.(png|jpg|svg)")
MEDIA_TYPES = {"png": "image/png", "jpg": "image/jpeg", "svg": "image/svg+xml"}


def _session_id(request: Request) -> str:
    session_id = request.path_params["session_id"]
    try:
        check_id(session_id, "session id")
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from None
    return session_id


async def session_page(request: Request) -> Response:
    session_id = _session_id(request)
    return page(request, "session.html", session_id=session_id)


def trimmed_notice(client: Client, session_id: str, cursor: str) -> str:
    """What a client resuming after `cursor` missed to trimming, or "" when it missed
    nothing (its cursor is still in the stream, or nothing came before the oldest entry)."""
    key = client.keys.stream(session_id)
    first = client.redis.xrange(key, count=1)
    if not first or _id(text(first[0][0])) <= _id(cursor):
        return ""
    if client.redis.xrange(key, min=cursor, max=cursor):
        return ""
    oldest = entries_to_events(session_id, first)[0]
    return (
        f"events after {cursor} up to seq {oldest.seq - 1} were trimmed from the stream "
        f"(ACTFLEET_STREAM_MAXLEN); showing from seq {oldest.seq}"
    )


def _id(stream_id: str) -> tuple[int, int]:
    ms, _, n = stream_id.partition("-")
    return int(ms), int(n or 0)


async def session_events(request: Request) -> Response:
    """The session's events after `Last-Event-ID` (or `?after=`), then live ones."""
    session_id = _session_id(request)
    cursor = request.headers.get("last-event-id") or request.query_params.get("after") or None
    if cursor is not None and not STREAM_ID.fullmatch(cursor):
        raise HTTPException(400, f"{cursor!r} is not a stream id (like 1712345678901-0)")
    client: Client = request.app.state.client
    read_only: bool = request.app.state.read_only

    async def stream() -> AsyncIterator[ServerSentEvent]:
        if cursor is not None and (
            notice := await threaded(trimmed_notice, client, session_id, cursor)
        ):
            yield ServerSentEvent(event="trimmed", data=json.dumps({"message": notice}))
        async for event in client.aevents(session_id, after=cursor):
            where = {
                "agent": event.agent_id,
                "parent": event.parent_corr_id,
                "key": chunk_key(event),
            }
            if isinstance(event, CHUNKS):
                data = {**where, "text": chunk_text(event), "kind": event.type}
                yield ServerSentEvent(id=event.id, event="chunk", data=json.dumps(data))
            else:
                data = {**where, "type": event.type, "html": event_html(event, read_only)}
                data["request"] = getattr(event, "request_id", "")
                yield ServerSentEvent(id=event.id, event="event", data=json.dumps(data))

    return EventSourceResponse(stream(), ping=15)


async def cancel_session(request: Request) -> Response:
    await check_write(request)
    session_id = _session_id(request)
    try:
        await threaded(request.app.state.client.cancel, session_id)
    except UnknownSession as exc:
        raise HTTPException(404, str(exc)) from None
    return PlainTextResponse(f"cancel sent to {session_id}")


def follow_up(client: Client, session_id: str, prompt: str) -> str:
    """Submit a prompt to the session with its last turn's model."""
    if not client.session_exists(session_id):
        raise UnknownSession(session_id)
    model = ""
    for entry in client.redis.xrevrange(client.keys.stream(session_id), count=2000):
        event = entries_to_events(session_id, [entry])[0]
        if isinstance(event, TurnStarted) and event.agent_id == "main":
            model = event.model
            break
    if not model:
        raise ValueError("this session's model is not in its stream any more; use actfleet run")
    return client.submit(prompt, model=model, session_id=session_id).turn_id


async def send_prompt(request: Request) -> Response:
    await check_write(request)
    session_id = _session_id(request)
    prompt = str((await request.form()).get("prompt", ""))
    try:
        await threaded(follow_up, request.app.state.client, session_id, prompt)
    except UnknownSession as exc:
        raise HTTPException(404, str(exc)) from None
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from None
    if request.headers.get("hx-request"):
        return PlainTextResponse("prompt sent")
    return RedirectResponse(f"/sessions/{session_id}", status_code=303)


async def full_output(request: Request) -> Response:
    ref = request.path_params["ref"]
    try:
        output = await threaded(request.app.state.client.output, ref)
    except KeyError as exc:
        raise HTTPException(404, str(exc.args[0])) from None
    return PlainTextResponse(output)


async def image(request: Request) -> Response:
    """An image a cell displayed, from Redis. SVG is served as an image that can run
    nothing (a sandboxing CSP), since the kernel wrote it."""
    name = request.path_params["name"]
    if not IMAGE_NAME.fullmatch(name):
        raise HTTPException(404, "not an image name (<sha256>.png|jpg|svg)")
    client: Client = request.app.state.client
    data = await threaded(client.redis.get, client.keys.image(name))
    if data is None:
        raise HTTPException(404, f"no image {name} (expired: ACTFLEET_OUTPUT_TTL)")
    headers = {
        "content-security-policy": "default-src 'none'; style-src 'unsafe-inline'; sandbox",
        "x-content-type-options": "nosniff",
        "cache-control": "private, max-age=86400",
    }
    return Response(data, media_type=MEDIA_TYPES[name.rsplit(".", 1)[1]], headers=headers)
