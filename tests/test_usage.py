"""Cost and budgets (pricing and budget checks alone), then retries, cost and budgets with
real nodes and kernels: a provider (the local OpenAI stub) that rate-limits, refuses a key,
or is priced by name; a replay model with no price; a token budget that ends a turn; and the
same for batches (attempts in results, the circuit breaker, the batch's cost budget)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from genai_prices import Usage, calc_price
from pydantic_ai.messages import ModelResponse, TextPart
from pydantic_ai.usage import RequestUsage

from actfleet.broker import events as ev
from actfleet.broker.records import TurnRecord
from actfleet.broker.settings import Settings
from actfleet.client import Client
from actfleet.workers.budgets import budget_reached
from actfleet.workers.context import NodeContext
from actfleet.workers.pricing import response_cost
from tests.conftest import cli, events_of, provider_fleet, wait_for, write_replay
from tests.openai_stub import CodeCall, ErrorReply, OpenAIStub, Text
from tests.test_batches import write_items

PRICED = "openai-chat:gpt-4o-mini"
"""A model the price table knows; the stub answers as it."""


# pricing and budgets, without a fleet:


def response(
    model_name: str | None, provider: str | None, tokens: tuple[int, int]
) -> ModelResponse:
    usage = RequestUsage(input_tokens=tokens[0], output_tokens=tokens[1])
    return ModelResponse(
        parts=[TextPart("hi")], usage=usage, model_name=model_name, provider_name=provider
    )


def test_a_response_is_priced_by_the_model_and_provider_it_names():
    dated = response("gpt-4o-mini-2024-07-18", "openai", (1000, 500))
    price = calc_price(
        Usage(input_tokens=1000, output_tokens=500), "gpt-4o-mini", provider_id="openai"
    )

    assert price.total_price > 0
    assert response_cost(dated, PRICED) == pytest.approx(float(price.total_price))


@pytest.mark.parametrize(
    ("reply", "model"),
    [
        (response("replay:r.jsonl", None, (50, 5)), "replay:r.jsonl"),
        (response("qwen2.5-coder-local", "openai", (50, 5)), "openai-chat:qwen2.5-coder-local"),
        (response("gpt-4o-mini", "openai", (0, 0)), PRICED),  # the provider sent no usage
    ],
)
def test_an_unknown_price_is_none_never_zero(reply: ModelResponse, model: str):
    assert response_cost(reply, model) is None


def turn(options: dict, **usage: float) -> TurnRecord:
    return TurnRecord(
        session_id="s",
        agent_id="main",
        turn_id="t",
        prompt="p",
        model=PRICED,
        created_at=0.0,
        options=options,
        **usage,
    )


def test_budgets_are_reached_at_their_limits_and_not_before():
    ctx = NodeContext("n1", "boot", Settings(), redis=None, publish=lambda *_: None)

    def reached(options: dict, **usage: float) -> str | None:
        return asyncio.run(budget_reached(ctx, turn(options, **usage)))

    assert reached({"max_tokens": 100}, input_tokens=60, output_tokens=39) is None
    assert reached({"max_tokens": 100}, input_tokens=60, output_tokens=40) == (
        "token budget reached: 100 tokens used, --max-tokens 100"
    )
    assert reached({"max_cost": 0.5}, cost=0.49) is None
    assert reached({"max_cost": 0.5}, cost=0.5) == (
        "cost budget reached: $0.5000 spent, --max-cost 0.5"
    )
    assert reached({}, input_tokens=10**9, cost=10**6) is None


# with a fleet:


@pytest.fixture(scope="module")
def stub():
    """A local OpenAI-compatible server; each test sets its script and failures."""
    with OpenAIStub([Text("unset")], model="gpt-4o-mini") as server:
        yield server


@pytest.fixture(scope="module")
def fleet(redis_server: str, tmp_path_factory: pytest.TempPathFactory, stub: OpenAIStub):
    retries = {"ACTFLEET_MODEL_RETRY_BASE": "0.01", "ACTFLEET_MODEL_RETRY_MAX_DELAY": "3600"}
    workdir = tmp_path_factory.mktemp("fleet")
    with provider_fleet(redis_server, workdir, stub, "u1", retries) as fleet:
        yield fleet


@pytest.fixture
def client(fleet) -> Client:
    return Client(fleet.redis_url)


def test_two_429s_then_an_answer_complete_the_turn_in_3_attempts_priced(
    client: Client, stub: OpenAIStub
):
    limited = ErrorReply(429, "Rate limit reached", {"Retry-After": "0"})
    stub.responses, stub.failures = [Text("fine, thanks")], [limited, limited]
    handle = client.submit("how are you?", model=PRICED, approval="auto")

    result = client.wait(handle, timeout=60)

    assert (result.status, result.response, result.attempts) == ("finished", "fine, thanks", 3)
    events = events_of(client, handle.session_id)
    retries = [e for e in events if isinstance(e, ev.ModelRetry)]
    assert [(r.attempt, r.max_attempts) for r in retries] == [(1, 5), (2, 5)]
    assert all("HTTP 429: Rate limit reached" in r.error for r in retries)
    (usage,) = [e for e in events if isinstance(e, ev.Usage)]
    price = calc_price(
        Usage(input_tokens=usage.input_tokens, output_tokens=usage.output_tokens),
        "gpt-4o-mini",
        provider_id="openai",
    )
    assert usage.cost == pytest.approx(float(price.total_price)) and usage.cost > 0
    assert result.usage["cost"] == pytest.approx(usage.cost) and result.usage["unpriced"] == 0
    finished = events[-1]
    assert isinstance(finished, ev.TurnFinished) and finished.attempts == 3
    assert client.session_usage(handle.session_id) == result.usage


def test_a_refused_key_fails_at_once_as_permanent(client: Client, stub: OpenAIStub):
    stub.responses, stub.failures = [ErrorReply(401, "Incorrect API key provided")], []
    sent_before = len(stub.requests)
    handle = client.submit("hello", model=PRICED, approval="auto")

    result = client.wait(handle, timeout=60)

    assert (result.status, result.error_kind, result.attempts) == ("failed", "permanent", 1)
    assert "HTTP 401: Incorrect API key provided" in result.error
    assert len(stub.requests) == sent_before + 1
    events = events_of(client, handle.session_id)
    assert not [e for e in events if isinstance(e, ev.ModelRetry)]
    failed = events[-1]
    assert isinstance(failed, ev.TurnFailed)
    assert (failed.error_kind, failed.attempts) == ("permanent", 1)


def test_cancelling_a_turn_that_waits_to_retry_ends_it_at_once(client: Client, stub: OpenAIStub):
    stub.responses = [Text("too late")]
    stub.failures = [ErrorReply(503, "overloaded", {"Retry-After": "3600"})]
    handle = client.submit("hello", model=PRICED, approval="auto")

    def waiting() -> list[ev.Event]:
        return [e for e in events_of(client, handle.session_id) if isinstance(e, ev.ModelRetry)]

    (retry,) = wait_for(waiting, 30, "the retry's announcement")
    assert retry.delay == 3600
    client.cancel(handle.session_id)
    result = client.wait(handle, timeout=30)  # well before the hour the retry would wait
    assert (result.status, result.attempts) == ("cancelled", 2)


def test_a_token_budget_ends_a_replayed_turn_before_its_next_model_step(
    fleet, client: Client, tmp_path: Path
):
    replay = write_replay(
        tmp_path / "r.jsonl", {"code": "print(1)"}, {"code": "print(2)"}, {"text": "never"}
    )
    args = ["run", "count", "--model", f"replay:{replay}", "--approve", "auto"]
    proc = cli(fleet.redis_url, *args, "--max-tokens", "1")

    assert proc.returncode == 4, proc.stderr
    assert "turn not completed: stopped by its budget" in proc.stdout
    assert "cost unknown" in proc.stdout and "$0" not in proc.stdout
    session_id = client.sessions(limit=1)[0][0]
    events = events_of(client, session_id)
    (usage,) = [e for e in events if isinstance(e, ev.Usage)]  # no model step after the first
    assert usage.cost is None
    outputs = [e for e in events if isinstance(e, ev.CodeExecutionOutput)]
    assert [o.text.strip() for o in outputs] == ["1"]
    finished = events[-1]
    assert isinstance(finished, ev.TurnFinished) and finished.reason == "budget"
    assert finished.usage["cost"] is None and finished.usage["unpriced"] == 1
    result = client.result(finished.turn_id)
    assert result is not None and result.error.startswith("token budget reached")


# batches against the provider:


def test_an_item_rate_limited_twice_completes_in_3_attempts_with_its_cost(
    fleet, stub: OpenAIStub, tmp_path: Path
):
    limited = ErrorReply(429, "Rate limit reached", {"Retry-After": "0"})
    stub.responses, stub.failures = [Text("fine")], [limited, limited]
    batch = Client(fleet.redis_url).submit_batch(
        write_items(tmp_path / "one.jsonl", 1), model=PRICED, name="limited"
    )
    batch.wait(timeout=60)
    ((_, result),) = list(batch.results())
    assert (result["status"], result["response"], result["attempts"]) == ("completed", "fine", 3)
    assert result["cost"] > 0 and batch.record().cost == pytest.approx(result["cost"])


def test_a_refused_key_stops_the_batch_after_a_few_items_with_one_error(
    fleet, stub: OpenAIStub, tmp_path: Path
):
    stub.responses, stub.failures = [ErrorReply(401, "Incorrect API key provided")], []
    sent_before = len(stub.requests)
    items = write_items(tmp_path / "many.jsonl", 50)
    proc = cli(
        fleet.redis_url,
        "batch",
        "run",
        str(items),
        "-m",
        PRICED,
        "--concurrency",
        "2",
        "-o",
        str(tmp_path / "out.jsonl"),
    )
    assert proc.returncode == 1, proc.stderr
    assert "the first 3 items all failed with the same error" in proc.stderr
    assert "HTTP 401: Incorrect API key provided" in proc.stderr
    status = json.loads(cli(fleet.redis_url, "batch", "status", "b-many", "--json").stdout)
    assert status["status"] == "stopped" and status["queued"] >= 45
    assert len(stub.requests) - sent_before <= 4


def test_once_the_cost_budget_is_spent_no_model_step_starts_and_the_rest_end_budget(
    fleet, stub: OpenAIStub, tmp_path: Path
):
    """Items of two model steps each (a cell, then an answer), run one at a time. The
    budget is two items and half a first step: the third item's first step is the last
    request the provider sees; that item and every later one end `budget`."""
    stub.responses, stub.failures = [CodeCall("print(1)"), Text("one")], []
    client = Client(fleet.redis_url)
    probe = client.submit_batch(write_items(tmp_path / "probe.jsonl", 1), model=PRICED)
    probe.wait(timeout=60)
    ((_, first),) = list(probe.results())
    usage = [e for e in client.events(first["session_id"], follow=False) if isinstance(e, ev.Usage)]
    item_cost, first_step = first["cost"], usage[0].cost
    assert item_cost > 0 and len(usage) == 2

    sent_before = len(stub.requests)
    batch = client.submit_batch(
        write_items(tmp_path / "budget.jsonl", 8),
        model=PRICED,
        concurrency=1,
        max_cost=2 * item_cost + first_step / 2,
    )
    progress = batch.wait(timeout=60)
    assert progress.record.status == "budget"
    assert progress.record.counts["completed"] == 2 and progress.record.counts["budget"] == 6
    assert len(stub.requests) - sent_before == 5
