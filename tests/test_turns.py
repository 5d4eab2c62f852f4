"""A CodeAct turn end to end: CLI -> Redis -> Celery worker nodes -> kernel -> event stream."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import redis

from actfleet.client import Client
from tests.conftest import cli, write_replay
from tests.openai_stub import CodeCall, OpenAIStub, Text


@pytest.fixture(scope="module")
def stub():
    """A local server speaking OpenAI's streaming chat-completions protocol."""
    with OpenAIStub(
        [CodeCall("answer = 6 * 7\nprint(answer)"), Text("The answer is 42.")]
    ) as server:
        yield server


@pytest.fixture(scope="module")
def fleet(redis_server: str, tmp_path_factory: pytest.TempPathFactory, stub: OpenAIStub):
    """Two nodes shared by the tests of this module (each test uses its own sessions)."""
    from tests.conftest import Fleet, new_db_url

    url = new_db_url(redis_server)
    fleet = Fleet(
        url,
        tmp_path_factory.mktemp("fleet"),
        {"OPENAI_BASE_URL": stub.base_url, "OPENAI_API_KEY": "dummy-key"},
    )
    try:
        fleet.start("n1")
        fleet.start("n2")
        yield fleet
    finally:
        fleet.stop()


def events_json(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def test_turn_runs_code_and_answers(fleet, tmp_path: Path):
    replay = write_replay(
        tmp_path / "r.jsonl",
        {"thinking": "compute", "code": "x = 21 * 2\nprint(x)"},
        {"text": "It is 42."},
    )
    proc = cli(
        fleet.redis_url,
        "run",
        "--approve",
        "auto",
        "compute",
        "--model",
        f"replay:{replay}",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    events = events_json(proc.stdout)
    types = [e["type"] for e in events]
    assert types[0] == "TurnStarted" and types[-1] == "TurnFinished"
    assert "CodeAction" in types and "Thoughts" in types
    output = next(e for e in events if e["type"] == "CodeExecutionOutput")
    assert output["text"].strip() == "42" and output["truncated"] is False
    assert events[-1]["reason"] == "completed" and events[-1]["response"] == "It is 42."
    common = {
        "type",
        "session_id",
        "agent_id",
        "turn_id",
        "corr_id",
        "parent_corr_id",
        "seq",
        "ts",
        "node",
        "id",
    }
    assert all(common <= e.keys() for e in events)
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert {e["node"] for e in events if e["type"] == "CodeExecutionOutput"} <= {"n1", "n2"}
    assert events[0]["node"] == ""


def test_second_turn_of_a_session_sees_the_first_turns_variables(fleet, tmp_path: Path):
    replay = write_replay(
        tmp_path / "r.jsonl",
        {"code": "secret = 'kept across turns'"},
        {"text": "stored"},
        {"code": "print(secret)"},
        {"text": "done"},
    )
    first = cli(
        fleet.redis_url, "submit", "--approve", "auto", "store it", "--model", f"replay:{replay}"
    )
    assert first.returncode == 0, first.stderr
    session = first.stdout.strip()
    second = cli(
        fleet.redis_url,
        "run",
        "--approve",
        "auto",
        "print it",
        "--model",
        f"replay:{replay}",
        "--session",
        session,
        "--json",
    )
    assert second.returncode == 0, second.stderr
    outputs = [e for e in events_json(second.stdout) if e["type"] == "CodeExecutionOutput"]
    assert outputs[-1]["text"].strip() == "kept across turns"


def test_watch_after_an_id_prints_exactly_the_later_events(fleet, tmp_path: Path):
    replay = write_replay(tmp_path / "r.jsonl", {"code": "print('hello')"}, {"text": "bye"})
    run = cli(
        fleet.redis_url,
        "run",
        "--approve",
        "auto",
        "greet",
        "--model",
        f"replay:{replay}",
        "--json",
    )
    assert run.returncode == 0, run.stderr
    events = events_json(run.stdout)
    session = events[0]["session_id"]
    cut = len(events) // 2
    watch = cli(
        fleet.redis_url, "watch", session, "--after", events[cut]["id"], "--no-follow", "--json"
    )
    assert watch.returncode == 0, watch.stderr
    assert events_json(watch.stdout) == events[cut + 1 :]


def test_openai_chat_model_through_a_local_server_runs_code_and_answers(fleet, stub):
    proc = cli(
        fleet.redis_url,
        "run",
        "--approve",
        "auto",
        "what is 6 times 7?",
        "--model",
        "openai-chat:stub-model",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    events = events_json(proc.stdout)
    output = next(e for e in events if e["type"] == "CodeExecutionOutput")
    assert output["text"].strip() == "42"
    assert events[-1]["type"] == "TurnFinished"
    assert events[-1]["response"] == "The answer is 42."
    assert events[-1]["usage"]["requests"] == 2
    assert len(stub.requests) >= 2


def test_sdk_submit_and_wait_return_the_result(fleet, tmp_path: Path):
    replay = write_replay(tmp_path / "r.jsonl", {"code": "print(1 + 1)"}, {"text": "two"})
    client = Client(fleet.redis_url)
    handle = client.submit("add", model=f"replay:{replay}", approval="auto")
    result = client.wait(handle, timeout=60)
    assert (result.status, result.response, result.usage["requests"]) == ("finished", "two", 2)
    seen = [e.type for e in client.events(handle.session_id, follow=False)]
    assert seen[0] == "TurnStarted" and seen[-1] == "TurnFinished"


def test_failed_model_call_ends_the_turn_with_turn_failed(fleet, tmp_path: Path):
    replay = write_replay(tmp_path / "r.jsonl", {"code": "print(1)"})
    proc = cli(
        fleet.redis_url, "run", "--approve", "auto", "x", "--model", f"replay:{replay}", "--json"
    )
    assert proc.returncode == 1
    last = events_json(proc.stdout)[-1]
    assert last["type"] == "TurnFailed" and "replay" in last["error"]


def test_killed_node_mid_cell_turn_finishes_elsewhere_and_reports_interruption(
    redis_url: str, fleet_factory, tmp_path: Path
):
    fleet = fleet_factory(redis_url)
    fleet.start("a")
    fleet.start("b")
    replay = write_replay(
        tmp_path / "r.jsonl",
        {"code": "import time\nprint('sleeping', flush=True)\ntime.sleep(60)"},
        {"text": "recovered"},
    )
    client = Client(redis_url)
    handle = client.submit("sleep", model=f"replay:{replay}", approval="auto")
    chunk = None
    for event in client.events(handle.session_id):
        if event.type == "CodeExecutionOutputChunk":
            chunk = event
            break
    fleet.kill(chunk.node)
    result = client.wait(handle, timeout=60)
    assert result.status == "finished" and result.response == "recovered"
    events = list(client.events(handle.session_id, follow=False))
    outputs = [e for e in events if e.type == "CodeExecutionOutput"]
    assert len(outputs) == 1 and outputs[0].status == "lost"
    assert "not re-run" in outputs[0].text
    assert outputs[0].node != chunk.node
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert len({e.id for e in events}) == len(events)
    assert sum(e.type == "CodeAction" for e in events) == 1


def test_second_prompt_waits_for_the_running_turn(fleet, tmp_path: Path):
    replay = write_replay(
        tmp_path / "r.jsonl",
        {"code": "n = 1"},
        {"text": "first"},
        {"code": "print(n + 1)"},
        {"text": "second"},
    )
    client = Client(fleet.redis_url)
    first = client.submit("one", model=f"replay:{replay}", approval="auto")
    second = client.submit(
        "two", model=f"replay:{replay}", session_id=first.session_id, approval="auto"
    )
    assert client.wait(second, timeout=60).response == "second"
    assert client.result(first.turn_id).response == "first"


def test_unreachable_redis_is_a_one_line_error(tmp_path: Path):
    from actfleet.client.local_redis import free_port

    replay = write_replay(tmp_path / "r.jsonl", {"text": "hi"})
    proc = cli(f"redis://127.0.0.1:{free_port()}/0", "run", "x", "--model", f"replay:{replay}")
    assert proc.returncode == 3
    assert proc.stderr.count("\n") == 1 and "cannot reach Redis" in proc.stderr
    assert "ACTFLEET_REDIS_URL" in proc.stderr


@pytest.mark.parametrize(
    ("model", "expected"),
    [("nosuch:model", "unknown model provider"), ("gpt-4o", "provider:model")],
)
def test_unknown_model_string_is_refused_before_anything_is_written(redis_url, model, expected):
    proc = cli(redis_url, "run", "x", "--model", model)
    assert proc.returncode == 3
    assert proc.stderr.count("\n") == 1 and expected in proc.stderr
    assert redis.Redis.from_url(redis_url).dbsize() == 0


def test_malformed_replay_file_is_refused_naming_file_and_line(redis_url, tmp_path: Path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"code": 5}\n')
    proc = cli(redis_url, "run", "x", "--model", f"replay:{bad}")
    assert proc.returncode == 3
    assert proc.stderr.count("\n") == 1 and "bad.jsonl:2" in proc.stderr
    missing = cli(redis_url, "submit", "x", "--model", f"replay:{tmp_path / 'none.jsonl'}")
    assert missing.returncode == 3 and "none.jsonl" in missing.stderr
    assert redis.Redis.from_url(redis_url).dbsize() == 0


def test_run_timeout_exits_2(fleet, tmp_path: Path):
    replay = write_replay(
        tmp_path / "r.jsonl", {"code": "import time; time.sleep(5)"}, {"text": "late"}
    )
    proc = cli(
        fleet.redis_url,
        "run",
        "--approve",
        "auto",
        "slow",
        "--model",
        f"replay:{replay}",
        "--timeout",
        "1",
    )
    assert proc.returncode == 2 and "did not end within" in proc.stderr


def test_sigterm_drains_a_node_its_cell_finishes_and_the_turn_goes_on_elsewhere(
    redis_url: str, fleet_factory, tmp_path: Path
):
    fleet = fleet_factory(redis_url)
    fleet.start("d1")
    fleet.start("d2")
    replay = write_replay(
        tmp_path / "r.jsonl",
        {"code": "import time\nprint('working', flush=True)\ntime.sleep(3)\nprint('finished')"},
        {"code": "print('next cell')"},
        {"text": "drained"},
    )
    client = Client(redis_url)
    handle = client.submit("drain", model=f"replay:{replay}", approval="auto")
    chunk = next(
        e for e in client.events(handle.session_id) if e.type == "CodeExecutionOutputChunk"
    )
    fleet.nodes[chunk.node].send_signal(signal.SIGTERM)
    assert client.wait(handle, timeout=60).response == "drained"
    assert fleet.nodes[chunk.node].wait(30) == 0
    outputs = [
        e for e in client.events(handle.session_id, follow=False) if e.type == "CodeExecutionOutput"
    ]
    assert outputs[0].status == "ok" and "finished" in outputs[0].text
    assert outputs[0].node == chunk.node and outputs[1].node != chunk.node
    assert "kernel was restarted" in outputs[1].text
