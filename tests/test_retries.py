"""Retries of model requests, without a fleet: which provider errors are transient, what
Retry-After says, the backoff's bounds, and the retry loop against the local OpenAI stub."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from email.utils import format_datetime
from typing import Any

import pytest
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, UserPromptPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from actfleet.workers.models import ModelCallError, resolve_model, stream_response
from actfleet.workers.retries import (
    RetryPolicy,
    error_kind,
    parse_retry_after,
    retry_after,
    with_retries,
)
from tests.openai_stub import ErrorReply, OpenAIStub, Text

HELLO = [ModelRequest(parts=[UserPromptPart("hi")])]


@pytest.fixture
def stub_env(monkeypatch: pytest.MonkeyPatch) -> Any:
    def point_at(base_url: str) -> None:
        monkeypatch.setenv("OPENAI_BASE_URL", base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "dummy")

    return point_at


async def one_request(model_name: str = "openai-chat:stub") -> str:
    response = await stream_response(
        resolve_model(model_name), HELLO, [], on_thinking=lambda _: None, on_text=lambda _: None
    )
    return "".join(getattr(part, "content", "") for part in response.parts)


# Retry-After:


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("120", 120.0), (" 1.5 ", 1.5), ("0", 0.0), ("-3", None), ("soon", None), ("nan", None)],
)
def test_retry_after_in_seconds(value: str, seconds: float | None) -> None:
    assert parse_retry_after(value) == seconds


def test_retry_after_as_an_http_date_is_the_time_left_until_then() -> None:
    now = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC).timestamp()
    later = format_datetime(datetime(2025, 1, 1, 12, 0, 30, tzinfo=UTC), usegmt=True)

    assert parse_retry_after(later, now=now) == 30.0
    assert parse_retry_after("Wed, 01 Jan 2025 11:00:00 GMT", now=now) == 0.0


def test_backoff_doubles_with_jitter_and_honours_retry_after_up_to_the_cap() -> None:
    policy = RetryPolicy(retries=4, base=1.0, max_delay=5.0)

    for retry, (low, high) in enumerate([(0.5, 1.0), (1.0, 2.0), (2.0, 4.0)], start=1):
        assert low <= policy.delay(retry) <= high
    assert policy.delay(5) == 5.0  # 16 s of backoff, cut to the cap
    assert policy.delay(1, asked=3.0) == 3.0  # never sooner than the provider asked
    assert policy.delay(1, asked=3600.0) == 5.0  # a long Retry-After is cut to the cap


# error kinds, from real provider errors (the stub) through pydantic-ai's mapping:


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (429, "transient"),
        (500, "transient"),
        (503, "transient"),
        (401, "permanent"),
        (403, "permanent"),
        (400, "permanent"),
        (404, "permanent"),
    ],
)
def test_provider_errors_are_classified_by_status(stub_env: Any, status: int, kind: str) -> None:
    with OpenAIStub([ErrorReply(status, "no")]) as stub:
        stub_env(stub.base_url)
        with pytest.raises(ModelCallError) as caught:
            asyncio.run(one_request())

    assert error_kind(caught.value) == kind


def test_an_exhausted_quota_is_permanent_although_it_is_a_429(stub_env: Any) -> None:
    quota = ErrorReply(429, "You exceeded your current quota", code="insufficient_quota")
    with OpenAIStub([quota]) as stub:
        stub_env(stub.base_url)
        with pytest.raises(ModelCallError) as caught:
            asyncio.run(one_request())

    assert error_kind(caught.value) == "permanent"


def test_a_refused_connection_is_transient(stub_env: Any) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    stub_env(f"http://127.0.0.1:{port}/v1")

    with pytest.raises(ModelCallError) as caught:
        asyncio.run(one_request())

    assert error_kind(caught.value) == "transient"


def test_a_timeout_is_transient() -> None:
    async def stall(_messages: list[ModelMessage], _info: AgentInfo) -> AsyncIterator[str]:
        await asyncio.Event().wait()
        yield "never"

    model = FunctionModel(stream_function=stall, model_name="stalled")
    with pytest.raises(ModelCallError) as caught:
        asyncio.run(
            stream_response(model, HELLO, [], on_thinking=print, on_text=print, timeout=0.1)
        )

    assert error_kind(caught.value) == "transient"


def test_a_played_out_replay_is_permanent() -> None:
    model = resolve_model("replay:r.jsonl", '{"text": "once"}\n')
    history = [*HELLO, ModelResponse(parts=[TextPart("once")]), *HELLO]
    with pytest.raises(ModelCallError) as caught:
        asyncio.run(stream_response(model, history, [], on_thinking=print, on_text=print))

    assert error_kind(caught.value) == "permanent"


def test_retry_after_header_is_read_from_the_provider_error(stub_env: Any) -> None:
    with OpenAIStub([ErrorReply(429, "slow down", {"Retry-After": "7"})]) as stub:
        stub_env(stub.base_url)
        with pytest.raises(ModelCallError) as caught:
            asyncio.run(one_request())

    assert retry_after(caught.value) == 7.0


# the retry loop:


def test_two_429s_then_an_answer_take_three_attempts(stub_env: Any) -> None:
    limited = ErrorReply(429, "rate limited", {"Retry-After": "0"})
    told: list[tuple[int, str]] = []

    async def on_retry(failed: int, _delay: float, error: ModelCallError) -> None:
        told.append((failed, str(error)))

    with OpenAIStub([Text("hello")], failures=[limited, limited]) as stub:
        stub_env(stub.base_url)
        policy = RetryPolicy(retries=4, base=0.01, max_delay=0.05)
        answer = asyncio.run(with_retries(one_request, policy, on_retry))

    assert answer == "hello"
    assert len(stub.requests) == 3  # the SDK's own retries are off: each attempt is ours
    assert [failed for failed, _ in told] == [1, 2]
    assert "HTTP 429: rate limited" in told[0][1]


def test_retries_run_out_with_the_last_error_and_the_count(stub_env: Any) -> None:
    failing = [ErrorReply(500, "boom")] * 3

    async def on_retry(*_: Any) -> None:
        pass

    with OpenAIStub([Text("never")], failures=failing) as stub:
        stub_env(stub.base_url)
        policy = RetryPolicy(retries=2, base=0.01, max_delay=0.05)
        with pytest.raises(ModelCallError) as caught:
            asyncio.run(with_retries(one_request, policy, on_retry))

    assert str(caught.value).endswith("HTTP 500: boom (gave up after 3 attempts)")
    assert error_kind(caught.value) == "transient"
    assert len(stub.requests) == 3


def test_a_permanent_error_is_not_retried(stub_env: Any) -> None:
    async def on_retry(*_: Any) -> None:
        raise AssertionError("a 401 must not be retried")

    with OpenAIStub([ErrorReply(401, "bad key")]) as stub:
        stub_env(stub.base_url)
        policy = RetryPolicy(retries=4, base=0.01, max_delay=0.05)
        with pytest.raises(ModelCallError, match="HTTP 401: bad key$"):
            asyncio.run(with_retries(one_request, policy, on_retry))

    assert len(stub.requests) == 1


def test_cancelling_interrupts_the_wait_before_a_retry(stub_env: Any) -> None:
    waiting = asyncio.Event()

    async def on_retry(*_: Any) -> None:
        waiting.set()

    async def cancel_while_waiting() -> None:
        policy = RetryPolicy(retries=4, base=3600.0, max_delay=3600.0)
        work = asyncio.ensure_future(with_retries(one_request, policy, on_retry))
        await waiting.wait()
        work.cancel()
        with pytest.raises(asyncio.CancelledError):
            await work

    with OpenAIStub([Text("never")], failures=[ErrorReply(503, "busy")]) as stub:
        stub_env(stub.base_url)
        asyncio.run(asyncio.wait_for(cancel_while_waiting(), timeout=30))

    assert len(stub.requests) == 1
