"""The agent loop's edges, with real nodes and kernels: the tools a model is offered
(reset_kernel; a tool it was not offered), and what a turn that ends early leaves in the
agent's history for the next one."""

from __future__ import annotations

from pathlib import Path

import pytest

from actfleet.broker import events as ev
from actfleet.client import Client
from tests.conftest import events_of, provider_fleet, wait_for, write_replay
from tests.openai_stub import ErrorReply, OpenAIStub, Text


@pytest.fixture(scope="module")
def stub():
    """A local OpenAI-compatible server; each test sets its script (`stub.responses`)."""
    with OpenAIStub([Text("unset")]) as server:
        yield server


@pytest.fixture(scope="module")
def fleet(redis_server: str, tmp_path_factory: pytest.TempPathFactory, stub: OpenAIStub):
    with provider_fleet(redis_server, tmp_path_factory.mktemp("fleet"), stub, "l1") as fleet:
        yield fleet


@pytest.fixture
def client(fleet) -> Client:
    return Client(fleet.redis_url)


def rules_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "rules.toml"
    path.write_text(text)
    return str(path)


def test_reset_kernel_restarts_the_kernel_asks_under_ask_and_keeps_files(
    client: Client, tmp_path: Path
):
    replay = write_replay(
        tmp_path / "r.jsonl",
        {"code": "x = 1\nopen('keep.txt', 'w').write('kept')\nprint(x)"},
        {"tool_calls": [{"name": "reset_kernel", "args": {}}]},
        {"code": "print(open('keep.txt').read())\nprint(x)"},
        {"text": "reset done"},
    )
    policy = rules_file(tmp_path, 'allow = ["code"]\n')
    handle = client.submit("reset", model=f"replay:{replay}", approval=policy)

    def request() -> ev.ApprovalRequest | None:
        found = [
            e for e in events_of(client, handle.session_id) if isinstance(e, ev.ApprovalRequest)
        ]
        return found[0] if found else None

    asked = wait_for(request, 30, "the approval request of reset_kernel")
    assert (asked.kind, asked.tool_name) == ("tool", "reset_kernel")
    client.approve(asked.request_id, args_sha256=asked.args_sha256)
    result = client.wait(handle, timeout=60)
    assert (result.status, result.response) == ("finished", "reset done")
    events = events_of(client, handle.session_id)
    said = next(e for e in events if isinstance(e, ev.ToolOutput))
    assert said.tool_name == "reset_kernel" and "kernel was restarted" in said.content
    outputs = [e for e in events if isinstance(e, ev.CodeExecutionOutput)]
    assert outputs[0].text.strip() == "1"
    assert outputs[1].status == "error"
    assert "kept" in outputs[1].text and "NameError" in outputs[1].text


def test_a_call_of_an_unknown_tool_asks_nobody_and_the_turn_goes_on(client: Client, tmp_path: Path):
    replay = write_replay(
        tmp_path / "r.jsonl",
        {"tool_calls": [{"name": "web_search", "args": {"q": "weather"}}]},
        {"text": "no web search here"},
    )
    handle = client.submit("search", model=f"replay:{replay}", approval="ask")
    result = client.wait(handle, timeout=30)
    assert (result.status, result.response) == ("finished", "no web search here")
    events = events_of(client, handle.session_id)
    assert not [e for e in events if isinstance(e, ev.ApprovalRequest)]
    said = next(e for e in events if isinstance(e, ev.ToolOutput))
    assert said.content == (
        "[actfleet] Unknown tool 'web_search'; the tools are: "
        "execute_ipython_cell, reset_kernel, subagent_task."
    )


def test_a_turn_cancelled_while_the_model_streams_keeps_its_prompt_and_partial_answer(
    client: Client, stub: OpenAIStub
):
    slow = "Primes below ten: two, three, five, seven. " + "Let me double-check each one. " * 8
    stub.responses = [Text(slow, delay=0.3), Text("You asked about primes.")]
    handle = client.submit("Which primes are below ten?", model="openai-chat:stub", approval="auto")

    def streaming() -> bool:
        chunks = [
            e for e in events_of(client, handle.session_id) if isinstance(e, ev.ResponseChunk)
        ]
        return "two" in "".join(c.content for c in chunks)

    wait_for(streaming, 30, "the model's answer to stream")
    client.cancel(handle.session_id)
    assert client.wait(handle, timeout=30).status == "cancelled"
    partial = next(e for e in events_of(client, handle.session_id) if isinstance(e, ev.Response))
    assert partial.content.startswith("Primes below ten: two") and partial.content != slow

    second = client.submit(
        "What did I ask?", model="openai-chat:stub", session_id=handle.session_id, approval="auto"
    )
    assert client.wait(second, timeout=30).response == "You asked about primes."
    seen = [(m["role"], m.get("content")) for m in stub.requests[-1].body["messages"]]
    assert seen[1:] == [
        ("user", "Which primes are below ten?"),
        ("assistant", partial.content),
        ("user", "What did I ask?"),
    ]
    offered = [tool["function"]["name"] for tool in stub.requests[-1].body["tools"]]
    assert offered == ["execute_ipython_cell", "reset_kernel", "subagent_task"]


def test_a_failed_first_model_step_keeps_the_prompt(client: Client, stub: OpenAIStub):
    stub.responses = [ErrorReply(400, "the request was refused")]
    handle = client.submit("First question", model="openai-chat:stub", approval="auto")
    result = client.wait(handle, timeout=30)
    assert result.status == "failed" and "the request was refused" in result.error
    second = client.submit(
        "Second question", model="openai-chat:stub", session_id=handle.session_id, approval="auto"
    )
    client.wait(second, timeout=30)  # refused again (no answer yet): what matters is what it saw
    seen = [(m["role"], m.get("content")) for m in stub.requests[-1].body["messages"]]
    assert seen[1:] == [("user", "First question"), ("user", "Second question")]
