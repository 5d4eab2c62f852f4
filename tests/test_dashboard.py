"""The dashboard over HTTP: auth on every route, CSRF and read-only refusals, a live
session followed over SSE with a real node: resumed with Last-Event-ID (nothing missed or
repeated), an approval decided from the inbox as the logged-in user, an image served; and a
real batch: its page live, approved in bulk from it, cancelled, its results downloaded."""

from __future__ import annotations

import base64
import json
import re
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from starlette.testclient import TestClient

from actfleet.broker.batches import BatchItem, item_ids
from actfleet.client import Client
from actfleet.dashboard.app import DashboardConfig, create_app
from actfleet.dashboard.auth import Auth, AuthConfigError
from actfleet.dashboard.pages import cost_text
from tests.conftest import wait_for, write_replay
from tests.test_batches import one_cell, write_items

TOKEN = "t0ken-for-the-dashboard-tests"
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNkYAAAAAYAAjCB0C8AAAAASUVORK5CYII="
ROUTES = [
    "/",
    "/sessions",
    "/sessions/s-x",
    "/sessions/s-x/events",
    "/approvals",
    "/approvals/list",
    "/approvals/events",
    "/batches",
    "/batches/b-x",
    "/batches/b-x/events",
    "/batches/b-x/results.jsonl",
    "/outputs/x",
    "/images/" + "a" * 64 + ".png",
    "/static/htmx.min.js",
]


def _client(redis_url: str, **config) -> TestClient:
    auth = config.pop("auth", Auth())
    return TestClient(create_app(Client(redis_url), DashboardConfig(auth, **config)))


def test_every_route_needs_the_token_and_a_non_loopback_bind_needs_auth(redis_url: str) -> None:
    with _client(redis_url, auth=Auth(token=TOKEN)) as web:
        for path in ROUTES:
            assert web.get(path).status_code == 401, path
        assert web.post("/approvals/r-1/decide").status_code == 401
        assert web.post("/batches/b-x/cancel").status_code == 401
        assert web.get("/", headers={"authorization": f"Bearer {TOKEN}x"}).status_code == 401
        assert web.get("/", headers={"authorization": f"Bearer {TOKEN}"}).status_code == 200
        assert web.post("/login", data={"token": TOKEN}, follow_redirects=False).status_code == 303
        assert web.get("/sessions").status_code == 200  # the login cookie
    with pytest.raises(AuthConfigError, match="refusing to listen on 0.0.0.0"):
        Auth().check_bind("0.0.0.0")
    Auth().check_bind("127.0.0.1")


def test_state_changes_need_the_csrf_token_and_are_refused_read_only(redis_url: str) -> None:
    with _client(redis_url) as web:
        web.get("/")  # sets the CSRF cookie
        csrf = web.cookies["actfleet_csrf"]
        refused = web.post("/approvals/r-1/decide", data={"decision": "approve", "sha256": "x"})
        assert refused.status_code == 403 and "CSRF" in refused.text
        foreign = web.post(
            "/approvals/r-1/decide",
            data={"decision": "approve", "sha256": "x", "csrf_token": csrf},
            headers={"origin": "http://evil.example"},
        )
        assert foreign.status_code == 403
        unknown = web.post(
            "/approvals/r-1/decide",
            data={"decision": "approve", "sha256": "x"},
            headers={"x-csrf-token": csrf},
        )
        assert unknown.status_code == 409 and "no approval request" in unknown.text
    with _client(redis_url, read_only=True) as web:
        web.get("/")
        csrf = web.cookies["actfleet_csrf"]
        page = web.get("/sessions/s-x")
        assert "Cancel session" not in page.text
        cancel = web.post("/sessions/s-x/cancel", headers={"x-csrf-token": csrf})
        assert cancel.status_code == 403 and "read-only" in cancel.text


@pytest.fixture
def served(redis_url: str) -> Iterator[str]:
    """The dashboard on a free port with basic auth (alice, bob), as uvicorn serves it."""
    auth = Auth.load(basic="alice:wonderland,bob:builder")
    app = create_app(Client(redis_url), DashboardConfig(auth))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started, 10, "the dashboard to listen")
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


def _sse(response: httpx.Response) -> Iterator[dict]:
    """The messages of an SSE response: id, event, data (JSON)."""
    message: dict = {}
    for line in response.iter_lines():
        if not line:
            if "data" in message:
                yield message
            message = {}
        elif not line.startswith(":"):
            field, _, value = line.partition(":")
            message[field] = json.loads(value.strip()) if field == "data" else value.strip()


def test_live_session_resumes_without_gaps_and_the_inbox_decides_as_the_user(
    served: str, redis_url: str, fleet_factory, tmp_path: Path
) -> None:
    fleet = fleet_factory(redis_url)
    fleet.start("n1")
    code = (
        "import base64\nfrom IPython.display import Image, display\n"
        f"display(Image(data=base64.b64decode('{PNG}')))\nprint('drawn')"
    )
    replay = write_replay(tmp_path / "r.jsonl", {"code": code}, {"text": "A **dot**."})
    handle = Client(redis_url).submit("draw", model=f"replay:{replay}", approval="ask")
    alice = httpx.Client(base_url=served, auth=("alice", "wonderland"), timeout=30)
    url = f"/sessions/{handle.session_id}/events"

    seen: list[dict] = []
    with alice.stream("GET", url) as response:
        for message in _sse(response):
            seen.append(message)
            if message["data"].get("type") == "ApprovalRequest":
                break  # a dropped connection
    request = Client(redis_url).pending(handle.session_id)[0]
    assert request.args_sha256 in seen[-1]["data"]["html"]
    waiting = alice.get("/sessions", params={"status": "approval"}).text
    assert handle.session_id in waiting and "waiting for approval" in waiting

    alice.get("/approvals")
    csrf = alice.cookies["actfleet_csrf"]
    decided = alice.post(
        f"/approvals/{request.id}/decide",
        data={"decision": "approve", "sha256": request.args_sha256},
        headers={"x-csrf-token": csrf},
    )
    assert decided.status_code == 200 and "approved by alice" in decided.text
    bob = httpx.Client(base_url=served, auth=("bob", "builder"), timeout=30)
    bob.get("/approvals")
    late = bob.post(
        f"/approvals/{request.id}/decide",
        data={"decision": "reject", "sha256": request.args_sha256, "reason": "no"},
        headers={"x-csrf-token": bob.cookies["actfleet_csrf"]},
    )
    assert late.status_code == 409 and "already decided: approved by alice" in late.text

    headers = {"last-event-id": seen[-1]["id"]}
    with alice.stream("GET", url, headers=headers) as response:
        for message in _sse(response):
            seen.append(message)
            if message["data"].get("type") == "TurnFinished":
                break
    events = [json.loads(m) for m in (json.dumps(m) for m in seen)]
    stream = Client(redis_url).events(handle.session_id, follow=False)
    assert [m["id"] for m in events] == [e.id for e in stream]
    decision = next(m for m in events if m["data"].get("type") == "ApprovalDecision")
    assert "approved by alice" in decision["data"]["html"]
    output = next(m for m in events if m["data"].get("type") == "CodeExecutionOutput")
    assert "cell-image" in output["data"]["html"], output["data"]["html"]
    assert "![image]" not in output["data"]["html"]  # the page shows the image, not its link
    (src,) = [part.split('"')[0] for part in output["data"]["html"].split('src="')[1:]]
    image = alice.get(src)
    assert image.status_code == 200 and image.content == base64.b64decode(PNG)
    assert image.headers["content-type"] == "image/png"
    assert httpx.get(served + src).status_code == 401
    final = next(m for m in events if m["data"].get("type") == "Response")
    assert "<strong>dot</strong>" in final["data"]["html"]


def _next(messages: Iterator[dict], event: str) -> dict:
    """The data of the next SSE message of this event type."""
    return next(m for m in messages if m.get("event") == event)["data"]


def test_a_batch_page_follows_progress_is_approved_in_bulk_and_serves_its_results(
    served: str, redis_url: str, fleet_factory, tmp_path: Path
) -> None:
    """3 items under `ask` park for the same cell: the batch page shows that cell once with
    "approve all of this batch", the inbox (live over SSE, filtered by batch) empties when
    alice approves them from the batch page's form; the page's stream follows the batch to
    its end; the results download as JSONL; the sessions page filters by batch and shows a
    reported cost, "unknown" for an unpriced one. A second batch is cancelled from its page
    (refused read-only)."""
    fleet = fleet_factory(redis_url)
    fleet.start("n1", "--kernels", "6")
    client = Client(redis_url)
    model = f"replay:{one_cell(tmp_path)}"
    batch = client.submit_batch(
        write_items(tmp_path / "ask.jsonl", 3), model=model, concurrency=3, approval="ask"
    )
    other = client.submit("not in the batch", model=model, approval="auto")
    client.wait(other, timeout=60)
    wait_for(lambda: batch.progress().parked == 3, 60, "3 items parked")
    alice = httpx.Client(base_url=served, auth=("alice", "wonderland"), timeout=30)
    assert batch.id in alice.get("/batches").text

    page = alice.get(f"/batches/{batch.id}").text
    assert "Approve all of this batch (3)" in page and "3 items would run this" in page
    assert page.count("print") == 1  # the cell, shown once for the 3 requests
    requests = re.findall(r'name="request" value="([^"]+)"', page)
    assert sorted(requests) == sorted(
        f"{r.id}:{r.args_sha256}" for r in client.pending(batch=batch.id)
    )

    with (
        alice.stream("GET", f"/approvals/events?batch={batch.id}") as inbox,
        alice.stream("GET", f"/batches/{batch.id}/events") as live,
    ):
        inbox_messages, live_messages = _sse(inbox), _sse(live)
        assert _next(inbox_messages, "inbox")["html"].count('class="request card"') == 3
        assert "3 waiting for approval" in _next(live_messages, "waiting")["html"]
        decided = alice.post(
            "/approvals/approve-all",
            data={"request": requests},
            headers={"x-csrf-token": alice.cookies["actfleet_csrf"]},
        )
        assert decided.text.count("approved by alice") == 3, decided.text
        inboxes = [_next(inbox_messages, "inbox")["html"]]
        while "No request waits" not in inboxes[-1] and len(inboxes) < 3:  # one per decision
            inboxes.append(_next(inbox_messages, "inbox")["html"])
        assert "No request waits" in inboxes[-1]
        progress = ""
        for message in live_messages:
            if message["event"] == "progress":
                progress = message["data"]["html"]
            if message["event"] == "end":
                break
    assert "<b>3</b> / 3 ended" in progress and "done" in progress

    results = alice.get(f"/batches/{batch.id}/results.jsonl")
    assert results.headers["content-type"].startswith("application/x-ndjson")
    lines = [json.loads(line) for line in results.text.splitlines()]
    assert sorted(r["custom_id"] for r in lines) == ["item-0", "item-1", "item-2"]
    assert {r["status"] for r in lines} == {"completed"}

    def session(custom_id: str) -> str:
        return "actfleet:session:" + item_ids(batch.id, BatchItem(custom_id, "p", 1))[0]

    client.redis.hset(session("item-0"), mapping={"cost": "0.0123", "unpriced": "0"})
    client.redis.hset(session("item-1"), mapping={"cost": "0", "unpriced": "2"})
    sessions = alice.get("/sessions", params={"batch": batch.id}).text
    assert all(r["session_id"] in sessions for r in lines)
    assert other.session_id not in sessions
    assert "$0.0123" in sessions and "unknown" in sessions and "$0.0000" not in sessions

    second = client.submit_batch(
        write_items(tmp_path / "second.jsonl", 2), model=model, concurrency=2, approval="ask"
    )
    wait_for(lambda: second.progress().parked == 2, 60, "2 items parked")
    reader = TestClient(
        create_app(Client(redis_url), DashboardConfig(Auth(), read_only=True)),
    )
    reader.get("/")
    refused = reader.post(
        f"/batches/{second.id}/cancel", headers={"x-csrf-token": reader.cookies["actfleet_csrf"]}
    )
    assert refused.status_code == 403 and "read-only" in refused.text
    assert "Approve all" not in reader.get(f"/batches/{second.id}").text
    cancelled = alice.post(
        f"/batches/{second.id}/cancel", headers={"x-csrf-token": alice.cookies["actfleet_csrf"]}
    )
    assert cancelled.status_code == 200, cancelled.text
    assert second.wait(timeout=60).record.counts["cancelled"] == 2
    assert alice.get("/batches/b-nope").status_code == 404


def test_the_sessions_page_shows_a_sessions_usage_over_all_its_turns(
    redis_url: str, fleet_factory, tmp_path: Path
) -> None:
    """Two turns of one session: the row's tokens are the session's sum, not its last
    turn's."""
    fleet = fleet_factory(redis_url)
    fleet.start("n1")
    client = Client(redis_url)
    replay = write_replay(tmp_path / "r.jsonl", {"text": "one " * 50}, {"text": "two"})
    first = client.submit("first", model=f"replay:{replay}", approval="auto")
    last_turn = client.wait(first, timeout=60)
    again = client.submit("again", model=f"replay:{replay}", session_id=first.session_id)
    second = client.wait(again, timeout=60)
    total = client.session_usage(first.session_id)
    tokens = total["input_tokens"] + total["output_tokens"]
    last = second.usage["input_tokens"] + second.usage["output_tokens"]
    assert last_turn.usage["output_tokens"] and tokens > last
    page = _client(redis_url).get("/sessions", params={"search": first.session_id}).text
    assert f"<td>{tokens:,}</td>" in page


def test_a_cost_is_shown_as_reported_and_unknown_is_never_zero() -> None:
    assert cost_text({"input_tokens": 5}) == ""
    assert cost_text({"cost": 0.5}) == "$0.5000"
    assert cost_text({"cost": None, "unpriced": 1}) == "unknown"
    assert cost_text({"cost": "0", "unpriced": "3", "requests": "3"}) == "unknown"
    assert cost_text({"cost": 0.25, "unpriced": 1}) == "≥ $0.2500"
    assert cost_text({"cost": 0.25, "unpriced": 1, "requests": 2}) == "≥ $0.2500"
    assert cost_text({"cost": 0.0, "unpriced": 0, "requests": 3}) == "$0.0000"
