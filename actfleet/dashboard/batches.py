"""The Batches pages: every batch with its progress; one batch live over server-sent events
(counts per status, tokens, cost, rate, ETA, its error once stopped), its requests waiting
for approval (approved in bulk, bound to the code shown), cancel, and its results as JSONL."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

from markupsafe import Markup
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse

from actfleet.broker.connection import async_redis
from actfleet.broker.ids import BadId
from actfleet.broker.records import ApprovalRecord
from actfleet.broker.transitions import text
from actfleet.client.batch import Batch, BatchProgress, UnknownBatch
from actfleet.client.sdk import Client
from actfleet.dashboard.auth import CSRF_COOKIE
from actfleet.dashboard.pages import check_write, page, templates, threaded
from actfleet.dashboard.render import request_code

LIST_SIZE = 50
"""Batches on the list page, newest first."""


def _batch(client: Client, batch_id: str) -> Batch:
    """The batch a path names; 400 for a malformed id, 404 for an unknown one."""
    try:
        return client.batch(batch_id)
    except UnknownBatch as exc:
        raise HTTPException(404, str(exc)) from None
    except BadId as exc:
        raise HTTPException(400, str(exc)) from None


def read_batches(client: Client) -> list[BatchProgress]:
    """The newest batches with their progress (a batch deleted meanwhile is left out)."""
    progress = []
    for record in client.batches(LIST_SIZE):
        try:
            progress.append(Batch(client, record.id).progress())
        except UnknownBatch:
            continue
    return progress


async def batches_page(request: Request) -> Response:
    rows = await threaded(read_batches, request.app.state.client)
    return page(request, "batches.html", rows=rows)


@dataclass(frozen=True)
class WaitingCode:
    """Requests of a batch that would run the same thing (one sha256), shown once."""

    kind: str
    args_sha256: str
    body: Markup
    records: list[ApprovalRecord]


def waiting_codes(records: list[ApprovalRecord]) -> list[WaitingCode]:
    """A batch's pending requests grouped by what they would run, oldest first."""
    groups: dict[str, list[ApprovalRecord]] = {}
    for record in records:
        groups.setdefault(record.args_sha256, []).append(record)
    return [
        WaitingCode(
            kind=items[0].kind,
            args_sha256=sha,
            body=request_code(items[0].kind, items[0].tool_name, items[0].args),
            records=items,
        )
        for sha, items in groups.items()
    ]


def _progress_html(progress: BatchProgress) -> str:
    return templates.get_template("batch_progress.html").render(p=progress, r=progress.record)


def _waiting_html(request: Request, batch_id: str, records: list[ApprovalRecord]) -> str:
    return templates.get_template("batch_waiting.html").render(
        batch_id=batch_id,
        codes=waiting_codes(records),
        count=len(records),
        read_only=request.app.state.read_only,
        csrf_token=request.cookies.get(CSRF_COOKIE, ""),
    )


def _snapshot(client: Client, batch: Batch) -> tuple[BatchProgress, list[ApprovalRecord]]:
    progress = batch.progress()
    waiting = client.pending(batch=batch.id) if progress.parked else []
    return progress, waiting


async def batch_page(request: Request) -> Response:
    client: Client = request.app.state.client
    batch = await threaded(_batch, client, request.path_params["batch_id"])
    progress, waiting = await threaded(_snapshot, client, batch)
    return page(
        request,
        "batch.html",
        batch_id=batch.id,
        progress=Markup(_progress_html(progress)),
        waiting=Markup(_waiting_html(request, batch.id, waiting)),
        finished=progress.finished,
    )


async def batch_events(request: Request) -> Response:
    """The batch's progress, live: a `progress` message whenever it changes (at once when an
    item ends, else at most each second), a `waiting` message whenever its pending requests
    change, and `end` once every item has ended. Each message is the whole fragment, so a
    reconnect needs no cursor."""
    client: Client = request.app.state.client
    batch = await threaded(_batch, client, request.path_params["batch_id"])
    results = client.keys.batch_results(batch.id)

    async def stream() -> AsyncIterator[ServerSentEvent]:
        conn = async_redis(client.settings)
        try:
            last = await conn.xrevrange(results, count=1)
            cursor = text(last[0][0]) if last else "0-0"
            shown, waiting_ids = "", None
            while True:
                progress, waiting = await threaded(_snapshot, client, batch)
                html = _progress_html(progress)
                if html != shown:
                    shown = html
                    yield ServerSentEvent(event="progress", data=json.dumps({"html": html}))
                ids = [r.id for r in waiting]
                if ids != waiting_ids:
                    waiting_ids = ids
                    fragment = _waiting_html(request, batch.id, waiting)
                    yield ServerSentEvent(event="waiting", data=json.dumps({"html": fragment}))
                if progress.finished:
                    yield ServerSentEvent(event="end", data="{}")
                    return
                reply = await conn.xread({results: cursor}, count=1000, block=1000)
                if reply:
                    cursor = text(reply[0][1][-1][0])
        finally:
            await conn.aclose()

    return EventSourceResponse(stream(), ping=15)


async def cancel_batch(request: Request) -> Response:
    await check_write(request)
    client: Client = request.app.state.client
    batch = await threaded(_batch, client, request.path_params["batch_id"])
    await threaded(batch.cancel)
    return PlainTextResponse(f"batch {batch.id} cancelled: no item starts; running ones stop")


async def batch_results(request: Request) -> Response:
    """The results so far as JSONL (one line per ended item, in completion order), streamed
    from the results stream, never held whole."""
    client: Client = request.app.state.client
    batch = await threaded(_batch, client, request.path_params["batch_id"])

    def lines() -> Iterator[str]:
        for _, result in batch.results():
            yield json.dumps(result) + "\n"

    headers = {"content-disposition": f'attachment; filename="{batch.id}.results.jsonl"'}
    return StreamingResponse(lines(), media_type="application/x-ndjson", headers=headers)
