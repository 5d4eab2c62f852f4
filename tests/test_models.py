"""The worker's model layer: replay model, the real provider path (local stub), names, errors."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine
from typing import Any, TypeVar

import pytest
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    SystemPromptPart,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models import Model
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.providers import infer_provider_class

from actfleet.broker.model_names import (
    BARE_MODELS,
    GATEWAY_UPSTREAMS,
    MODEL_PROVIDERS,
    ModelNameError,
    check_model_name,
)
from actfleet.workers.models import (
    CODE_TOOL,
    ModelCallError,
    ModelConfigError,
    code_tool_definition,
    dump_message,
    load_message,
    resolve_model,
    stream_response,
    system_prompt,
)
from tests.openai_stub import CodeCall, ErrorReply, OpenAIStub, Text

T = TypeVar("T")

SCRIPT = """\
{"thinking": "I should list the files first.", "text": "Let me look.", "code": "!ls"}
{"agent": "sub", "text": "sub done"}
{"code": "x = 1", "tool_calls": [{"name": "subagent_task", "args": {"prompt": "p"}}]}
{"text": "All done."}
"""


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def user_request(prompt: str) -> ModelRequest:
    return ModelRequest(parts=[SystemPromptPart(system_prompt("/work")), UserPromptPart(prompt)])


def tool_results(response: ModelResponse) -> ModelRequest:
    return ModelRequest(
        parts=[
            ToolReturnPart(call.tool_name, "ok", tool_call_id=call.tool_call_id)
            for call in response.tool_calls
        ]
    )


async def collect(
    model: Model, messages: list[ModelMessage], timeout: float | None = None
) -> tuple[ModelResponse, str, str]:
    """One streamed response and the thinking and text its callbacks received."""
    thinking: list[str] = []
    text: list[str] = []
    response = await stream_response(
        model,
        messages,
        [code_tool_definition()],
        on_thinking=thinking.append,
        on_text=text.append,
        timeout=timeout,
    )
    return response, "".join(thinking), "".join(text)


# replay:


def test_replay_model_streams_thinking_text_and_code_call() -> None:
    model = resolve_model("replay:demo.jsonl", SCRIPT)

    response, thinking, text = run(collect(model, [user_request("list files")]))

    assert thinking == "I should list the files first."
    assert text == "Let me look."
    assert [type(part) for part in response.parts] == [ThinkingPart, TextPart, ToolCallPart]
    (call,) = response.tool_calls
    assert call.tool_name == CODE_TOOL
    assert call.args_as_dict() == {"code": "!ls"}
    assert response.model_name == "replay:demo.jsonl"
    assert response.usage.output_tokens > 0


def test_replay_model_answers_with_the_line_at_the_history_response_count() -> None:
    history: list[ModelMessage] = [user_request("go")]
    texts = []
    for _ in range(3):
        # A fresh model per step: the position comes from the history alone (restart-safe).
        response, _, text = run(collect(resolve_model("replay:demo.jsonl", SCRIPT), history))
        history += [response, tool_results(response)]
        texts.append(text)

    assert texts == ["Let me look.", "", "All done."]
    assert [c.tool_name for c in history[3].tool_calls] == [CODE_TOOL, "subagent_task"]
    assert history[5].tool_calls == []


def test_replay_tool_call_ids_are_unique_and_deterministic() -> None:
    history: list[ModelMessage] = [user_request("go"), ModelResponse(parts=[TextPart("earlier")])]

    first, _, _ = run(collect(resolve_model("replay:demo.jsonl", SCRIPT), history))
    again, _, _ = run(collect(resolve_model("replay:demo.jsonl", SCRIPT), history))

    ids = [call.tool_call_id for call in first.tool_calls]
    assert len(set(ids)) == 2
    assert ids == [call.tool_call_id for call in again.tool_calls]


def test_replay_subagent_plays_only_sub_lines() -> None:
    model = resolve_model("replay:demo.jsonl", SCRIPT, agent_kind="sub")

    response, _, text = run(collect(model, [user_request("sub task")]))

    assert text == "sub done"
    assert response.tool_calls == []


def test_replay_past_the_end_of_the_script_is_a_clear_error() -> None:
    history: list[ModelMessage] = [user_request("go")]
    history += [ModelResponse(parts=[TextPart("x")]), user_request("again")] * 3
    model = resolve_model("replay:demo.jsonl", SCRIPT)

    with pytest.raises(ModelCallError, match=r"played out: the main agent asked for response 4"):
        run(collect(model, history))


def test_replay_without_its_text_is_a_config_error() -> None:
    with pytest.raises(ModelConfigError, match="needs its replay text"):
        resolve_model("replay:demo.jsonl")


def test_malformed_replay_text_is_a_config_error_naming_the_line() -> None:
    with pytest.raises(ModelConfigError, match=r'^demo\.jsonl:1: "code" must be a string'):
        resolve_model("replay:demo.jsonl", '{"code": 3}')


# the real provider path, against a local OpenAI-compatible server:


@pytest.fixture
def stub_env(monkeypatch: pytest.MonkeyPatch) -> Any:
    def point_at(stub: OpenAIStub, api_key: str = "dummy") -> None:
        monkeypatch.setenv("OPENAI_BASE_URL", stub.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", api_key)

    return point_at


def test_openai_chat_streams_a_code_call_then_text_from_the_stub(stub_env: Any) -> None:
    script = [CodeCall("print(6 * 7)", text="Computing."), Text("It is 42.", thinking="easy")]
    with OpenAIStub(script) as stub:
        stub_env(stub)
        model = resolve_model("openai-chat:stub")
        history: list[ModelMessage] = [user_request("what is 6*7?")]

        first, _, first_text = run(collect(model, history))
        history += [first, tool_results(first)]
        second, thinking, second_text = run(collect(model, history))

    assert first_text == "Computing."
    (call,) = first.tool_calls
    assert (call.tool_name, call.args_as_dict()) == (CODE_TOOL, {"code": "print(6 * 7)"})
    assert (thinking, second_text) == ("easy", "It is 42.")
    assert second.tool_calls == []
    # The stub reports 10 input tokens per message it was sent.
    assert second.usage.input_tokens == 10 * len(stub.requests[1].body["messages"])
    request = stub.requests[0]
    assert request.headers["authorization"] == "Bearer dummy"
    assert request.body["stream"] is True
    assert [tool["function"]["name"] for tool in request.body["tools"]] == [CODE_TOOL]
    assert request.body["messages"][0]["role"] == "system"


def test_provider_error_is_one_line_without_the_api_key(stub_env: Any) -> None:
    key = "sk-test-0123456789abcdef"
    with OpenAIStub([ErrorReply(401, f"Incorrect API key provided:\n{key}.")]) as stub:
        stub_env(stub, api_key=key)
        model = resolve_model("openai-chat:stub")

        with pytest.raises(ModelCallError) as caught:
            run(collect(model, [user_request("hi")]))

    message = str(caught.value)
    assert message.startswith("model 'stub' failed: HTTP 401: Incorrect API key provided")
    assert key not in message
    assert "\n" not in message


# stream_response itself:


def test_callback_errors_propagate_unchanged() -> None:
    def refuse(_: str) -> None:
        raise KeyError("publisher down")

    model = resolve_model("replay:demo.jsonl", SCRIPT)

    with pytest.raises(KeyError, match="publisher down"):
        run(stream_response(model, [user_request("go")], [], on_thinking=refuse, on_text=refuse))


def test_a_stalled_model_times_out_as_a_model_call_error() -> None:
    async def stall(_messages: list[ModelMessage], _info: AgentInfo) -> AsyncIterator[str]:
        await asyncio.Event().wait()
        yield "never"

    model = FunctionModel(stream_function=stall, model_name="stalled")

    with pytest.raises(
        ModelCallError, match=r"^model 'stalled' failed: no complete response within 0\.2 s$"
    ):
        run(collect(model, [user_request("go")], timeout=0.2))


# model names:


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("foo:bar", "unknown model provider 'foo' in 'foo:bar'; use one of openai-chat, openai,"),
        ("gpt-4o", "model 'gpt-4o' has no provider; write provider:model"),
        ("openai:", "names no model after the provider"),
        ("replay:", "names no file"),
        ("gateway/nope:x", "unknown gateway upstream 'nope'"),
        ("google-gla:gemini-2.5-flash", "unknown model provider 'google-gla'"),
    ],
)
def test_check_model_name_rejects_names_pydantic_ai_cannot_resolve(
    name: str, expected: str
) -> None:
    with pytest.raises(ModelNameError) as caught:
        check_model_name(name)

    assert expected in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "name",
    [
        "openai-chat:qwen2.5-coder",
        "openai:gpt-5",
        "anthropic:claude-sonnet-4-5",
        "google:gemini-2.5-pro",
        "ollama:llama3:8b",
        "gateway/openai:gpt-5",
        "replay:examples/demo.jsonl",
        "test",
    ],
)
def test_check_model_name_accepts_pydantic_ai_model_strings(name: str) -> None:
    check_model_name(name)


def test_bare_model_names_are_ones_pydantic_ai_resolves() -> None:
    for name in BARE_MODELS:
        check_model_name(name)
        assert isinstance(resolve_model(name), Model)


def test_hard_coded_providers_are_ones_the_installed_pydantic_ai_knows() -> None:
    names = [*MODEL_PROVIDERS, *(f"gateway/{upstream}" for upstream in GATEWAY_UPSTREAMS)]
    for name in names:
        # ValueError for a name it does not know; ImportError for a known one whose SDK
        # (an optional extra) is not installed here.
        with contextlib.suppress(ImportError):
            infer_provider_class(name)


def test_unknown_provider_is_a_model_config_error() -> None:
    with pytest.raises(ModelConfigError, match="unknown model provider 'foo'"):
        resolve_model("foo:bar")


@pytest.mark.parametrize(
    ("name", "variable"),
    [("openai:gpt-5", "OPENAI_API_KEY"), ("anthropic:claude-sonnet-4-5", "ANTHROPIC_API_KEY")],
)
def test_missing_provider_key_says_which_variable_to_set(
    monkeypatch: pytest.MonkeyPatch, name: str, variable: str
) -> None:
    for unset in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY"):
        monkeypatch.delenv(unset, raising=False)

    with pytest.raises(ModelConfigError) as caught:
        resolve_model(name)

    assert str(caught.value) == (
        f"cannot use model {name!r}: set {variable} in the worker's environment"
    )


# tool, prompt, serialisation:


def test_code_tool_takes_one_code_string() -> None:
    tool = code_tool_definition()

    assert tool.name == CODE_TOOL == "execute_ipython_cell"
    assert tool.parameters_json_schema["required"] == ["code"]
    assert tool.parameters_json_schema["properties"]["code"]["type"] == "string"
    assert "stateful" in (tool.description or "") and "'!'" in (tool.description or "")


def test_system_prompt_names_the_working_dir_and_the_code_tool() -> None:
    prompt = system_prompt("/srv/agents/s1")

    assert "`/srv/agents/s1`" in prompt
    assert CODE_TOOL in prompt
    assert "{working_dir}" not in prompt


def test_messages_round_trip_through_json_one_by_one() -> None:
    history: list[ModelMessage] = [user_request("go")]
    response, _, _ = run(collect(resolve_model("replay:demo.jsonl", SCRIPT), history))
    history += [response, tool_results(response)]

    assert [load_message(dump_message(message)) for message in history] == history
