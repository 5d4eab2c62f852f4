"""The Sessions page: newest first, paginated, filterable by status, model, node and batch,
searchable by id. Each row is summed up from the session's first and last events, its pending
approvals (a running session waiting for a decision says so), and its usage (tokens, cost
once reported): its ended turns' sum, kept on the session's record, plus the running turn's
so far."""

from __future__ import annotations

from dataclasses import dataclass, replace

import msgpack
from starlette.requests import Request
from starlette.responses import Response

from actfleet.broker.events import Cancelled, Event, TurnFailed, TurnFinished, TurnStarted
from actfleet.broker.stream import entries_to_events
from actfleet.broker.transitions import lease_holder, text
from actfleet.client.sdk import Client
from actfleet.dashboard.pages import cost_text, page, threaded

PAGE_SIZE = 50


@dataclass(frozen=True)
class SessionRow:
    id: str
    last_activity: float
    status: str
    model: str
    agents: int
    tokens: int
    node: str
    turn_id: str
    """The main agent's current turn, or the turn of the last event."""
    cost: str = ""
    """As `cost_text` shows it; "" while no cost is reported."""


FILTERS = ("status", "model", "node", "batch", "search")
USAGE_FIELDS = ("input_tokens", "output_tokens", "requests", "cost", "unpriced")
"""A turn record's usage fields (the count of unpriced requests has had both names)."""


def read_sessions(
    client: Client, page_no: int, status: str, model: str, node: str, batch: str, search: str
) -> tuple[list[SessionRow], bool]:
    """One page of sessions matching the filters, and whether there is a next one."""
    keys, r = client.keys, client.redis
    filtered = bool(status or model or node or batch or search)
    start = 0 if filtered else page_no * PAGE_SIZE
    stop = -1 if filtered else start + PAGE_SIZE  # one more than a page: is there a next?
    if batch:
        ids = batch_sessions(client, batch)
    else:
        ids = [
            (text(s), score)
            for s, score in r.zrevrange(keys.sessions(), start, stop, withscores=True)
        ]
    if search:
        ids = [(s, score) for s, score in ids if search in s]
    rows = _summaries(client, ids)
    if filtered:
        rows = [
            row
            for row in rows
            if (not status or row.status == status)
            and (not model or model in row.model)
            and (not node or row.node == node)
        ]
        rows = rows[page_no * PAGE_SIZE :]
    return _usage(client, rows[:PAGE_SIZE]), len(rows) > PAGE_SIZE


def batch_sessions(client: Client, batch: str) -> list[tuple[str, float]]:
    """The started sessions of a batch's items, newest activity first (an item's stored
    payload names its session; an item not started yet has none in the index)."""
    sessions = set()
    for _, blob in client.redis.hscan_iter(client.keys.batch_items(batch), count=500):
        try:
            session_id = msgpack.unpackb(blob, raw=True).get(b"session_id")
        except (ValueError, msgpack.UnpackException, AttributeError):
            continue
        if isinstance(session_id, bytes):
            sessions.add(text(session_id))
    ordered = sorted(sessions)
    scores = client.redis.zmscore(client.keys.sessions(), ordered) if ordered else []
    found = [(s, score) for s, score in zip(ordered, scores, strict=True) if score is not None]
    return sorted(found, key=lambda item: -item[1])


def _usage(client: Client, rows: list[SessionRow]) -> list[SessionRow]:
    """Rows with their session's tokens and cost: the ended turns' sum (subagents included)
    plus the running turn's, live."""
    with client.redis.pipeline(transaction=False) as pipe:
        for row in rows:
            pipe.hmget(client.keys.session(row.id), *USAGE_FIELDS)
            # A running turn's usage is not in the session's sum yet.
            running = row.status in RUNNING
            pipe.hmget(client.keys.turn(row.turn_id if running else "-"), *USAGE_FIELDS)
        replies = pipe.execute()
    updated = []
    for i, row in enumerate(rows):
        usage: dict[str, float] = {}
        for values in replies[2 * i : 2 * i + 2]:
            for name, value in zip(USAGE_FIELDS, values, strict=True):
                if value is not None:
                    usage[name] = usage.get(name, 0) + float(text(value) or 0)
        if "input_tokens" not in usage:
            updated.append(row)
            continue
        tokens = int(usage["input_tokens"] + usage.get("output_tokens", 0))
        updated.append(replace(row, tokens=tokens, cost=cost_text(usage)))
    return updated


def _summaries(client: Client, ids: list[tuple[str, float]]) -> list[SessionRow]:
    keys, r = client.keys, client.redis
    with r.pipeline(transaction=False) as pipe:
        for session_id, _ in ids:
            pipe.xrange(keys.stream(session_id), count=1)
            pipe.xrevrange(keys.stream(session_id), count=1)
            pipe.scard(keys.session_agents(session_id))
            pipe.hget(keys.agent(session_id, "main"), "active_turn")
            pipe.get(keys.lease(session_id, "main"))
            pipe.zcard(keys.approvals(session_id))
        replies = pipe.execute()
    rows = []
    for i, (session_id, score) in enumerate(ids):
        first, last, agents, active, lease, pending = replies[6 * i : 6 * i + 6]
        head = _event(session_id, first)
        tail = _event(session_id, last)
        rows.append(
            SessionRow(
                id=session_id,
                last_activity=score,
                status=_status(tail, bool(active and text(active)), pending),
                model=head.model if isinstance(head, TurnStarted) else "",
                agents=agents or 1,
                tokens=_tokens(tail),
                node=lease_holder(lease) or "",
                turn_id=text(active) if active else (tail.turn_id if tail else ""),
            )
        )
    return rows


def _event(session_id: str, entries: list) -> Event | None:
    return entries_to_events(session_id, entries)[0] if entries else None


RUNNING = ("running", "approval")
"""The statuses of a session whose main agent has a turn in progress."""


def _status(last: Event | None, active: bool, pending: int) -> str:
    if active:
        return "approval" if pending else "running"
    if isinstance(last, TurnFinished):
        return "finished" if last.reason == "completed" else last.reason
    if isinstance(last, TurnFailed):
        return "failed"
    if isinstance(last, Cancelled):
        return "cancelled"
    return "queued" if last is None else "idle"


def _tokens(last: Event | None) -> int:
    usage = getattr(last, "usage", None) or {}
    return int(usage.get("input_tokens", 0)) + int(usage.get("output_tokens", 0))


async def sessions_page(request: Request) -> Response:
    q = request.query_params
    try:
        page_no = max(0, int(q.get("page", "0")))
    except ValueError:
        page_no = 0
    filters = {name: q.get(name, "").strip() for name in FILTERS}
    rows, more = await threaded(read_sessions, request.app.state.client, page_no, **filters)
    return page(request, "sessions.html", rows=rows, page_no=page_no, more=more, filters=filters)
