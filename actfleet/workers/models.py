"""The model layer of a worker: resolving model strings, the code tool, one streamed response.

Models are called as freeact calls them: `pydantic_ai.direct.model_request_stream` over a plain
message history, so every pydantic-ai model string works. `replay:<file>` plays back a recorded
script (see `actfleet.broker.replay`) through a `FunctionModel`.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import AsyncIterator, Callable
from importlib.resources import files
from typing import Any

from pydantic import ConfigDict, TypeAdapter
from pydantic_ai.direct import model_request_stream
from pydantic_ai.exceptions import (
    ModelAPIError,
    ModelHTTPError,
    ModelRequestTimeout,
    UnexpectedModelBehavior,
    UserError,
)
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    ModelResponseStreamEvent,
    PartDeltaEvent,
    PartStartEvent,
    TextPart,
    TextPartDelta,
    ThinkingPart,
    ThinkingPartDelta,
)
from pydantic_ai.models import Model, ModelRequestParameters, infer_model
from pydantic_ai.models.function import (
    AgentInfo,
    DeltaThinkingCalls,
    DeltaThinkingPart,
    DeltaToolCall,
    DeltaToolCalls,
    FunctionModel,
)
from pydantic_ai.settings import ModelSettings
from pydantic_ai.tools import ToolDefinition

from actfleet.broker.model_names import REPLAY_PREFIX, ModelNameError, check_model_name
from actfleet.broker.replay import AgentKind, ReplayError, ReplayStep, parse_replay, steps_for

CODE_TOOL = "execute_ipython_cell"

_CODE_TOOL_DESCRIPTION = """\
Execute Python code in a stateful IPython kernel.

State (variables, imports, definitions) persists across calls. Executions are sequential.
For async code, use 'await' directly (the kernel has an active event loop).
Shell commands can be run with the '!' prefix (e.g., '!ls', '!git status', '!pip install pkg').

Returns:
    Execution output (stdout, stderr, value of the last expression) plus image paths as
    markdown links; the traceback if the code raised. Long output is truncated.
    Empty string if no output.
"""

_MESSAGE_ADAPTER: TypeAdapter[ModelMessage] = TypeAdapter(
    ModelMessage,
    config=ConfigDict(defer_build=True, ser_json_bytes="base64", val_json_bytes="base64"),
)

_ENV_VAR_IN_HINT = re.compile(r"`([A-Z][A-Z0-9_]*)` environment variable")
_SECRET_LIKE = re.compile(r"\b(?:sk|gsk|xai)-[A-Za-z0-9_\-*.]{8,}|\bAIza[0-9A-Za-z_\-]{20,}")
# pydantic-ai appends a pointer to its keyless test model to missing-key errors; not for our users.
_KEYLESS_HINT_START = " To try Pydantic AI"
_SECRET_ENV = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD)", re.IGNORECASE)
_MAX_DETAIL = 300


class ModelConfigError(RuntimeError):
    """A model string this worker cannot turn into a model; the message says what to fix."""


class ModelCallError(RuntimeError):
    """A model request failed; the message is one line and carries no secrets."""


def resolve_model(
    name: str, replay_text: str | None = None, agent_kind: AgentKind = "main"
) -> Model:
    """The model for `name`; `replay:<file>` plays `replay_text` (shipped by the client).

    Resolve once per runtime and reuse: a provider model owns an HTTP client
    (`async with model:` closes it).
    """
    try:
        check_model_name(name)
    except ModelNameError as exc:
        raise ModelConfigError(str(exc)) from None
    if name.startswith(REPLAY_PREFIX):
        return _replay_model(name, replay_text, agent_kind)
    try:
        return infer_model(name)
    except UserError as exc:
        raise ModelConfigError(_config_message(name, str(exc))) from None
    except ImportError as exc:  # pydantic-ai names the extra to install
        raise ModelConfigError(
            f"cannot use model {name!r} on this worker: {_one_line(str(exc))}"
        ) from None
    except Exception as exc:  # provider SDKs raise their own kinds for bad configuration
        raise ModelConfigError(
            f"cannot use model {name!r}: {_one_line(f'{type(exc).__name__}: {exc}')}"
        ) from None


SUBAGENT_TOOL = "subagent_task"


def subagent_tool_definition() -> ToolDefinition:
    """`subagent_task(prompt, max_turns=100)`: delegate to a subagent with its own kernel;
    offered to main agents only (no nesting)."""
    return ToolDefinition(
        name=SUBAGENT_TOOL,
        description=(
            "Delegate a task to a subagent that runs separately, with its own IPython kernel "
            "and history (it does not see your variables), and returns its final answer. "
            "Several subagent_task calls in one response run concurrently. Use it when the "
            "user asks for subagents or subtasks; give each a complete, self-contained prompt."
        ),
        parameters_json_schema={
            "type": "object",
            "properties": {
                "prompt": {"type": "string", "description": "The subagent's whole task."},
                "max_turns": {
                    "type": "integer",
                    "description": "Tool-execution rounds the subagent may take.",
                    "default": 100,
                },
            },
            "required": ["prompt"],
            "additionalProperties": False,
        },
    )


RESET_TOOL = "reset_kernel"


def reset_tool_definition() -> ToolDefinition:
    """`reset_kernel()`: a fresh kernel in place of the agent's (freeact's `ipybox_reset`)."""
    return ToolDefinition(
        name=RESET_TOOL,
        description=(
            "Restart your IPython kernel: every variable, import and definition is gone and "
            "the next execute_ipython_cell call runs in a fresh kernel. Files in the working "
            "directory are kept. Use it when the kernel's state is broken or you need a "
            "clean start."
        ),
        parameters_json_schema={"type": "object", "properties": {}, "additionalProperties": False},
        sequential=True,
    )


def tool_definitions(is_subagent: bool) -> list[ToolDefinition]:
    """The tools offered to an agent: the code tool, reset_kernel, and for a main agent
    subagent_task (subagents cannot nest)."""
    tools = [code_tool_definition(), reset_tool_definition()]
    if not is_subagent:
        tools.append(subagent_tool_definition())
    return tools


def tool_names(is_subagent: bool) -> list[str]:
    """The names of the tools offered to an agent, in the order they are offered."""
    return [tool.name for tool in tool_definitions(is_subagent)]


def code_tool_definition() -> ToolDefinition:
    """`execute_ipython_cell(code: str)`, described as ipybox describes it to the model."""
    return ToolDefinition(
        name=CODE_TOOL,
        description=_CODE_TOOL_DESCRIPTION,
        parameters_json_schema={
            "type": "object",
            "properties": {
                "code": {
                    "type": "string",
                    "title": "Code",
                    "description": "Python code to execute in the IPython kernel",
                }
            },
            "required": ["code"],
            "additionalProperties": False,
        },
        sequential=True,
    )


def system_prompt(working_dir: str) -> str:
    """The system prompt of a CodeAct agent whose kernel runs in `working_dir`."""
    template = files(__package__).joinpath("system_prompt.md").read_text(encoding="utf-8")
    return template.replace("{working_dir}", working_dir)


async def stream_response(
    model: Model,
    messages: list[ModelMessage],
    tools: list[ToolDefinition],
    *,
    on_thinking: Callable[[str], None],
    on_text: Callable[[str], None],
    timeout: float | None = None,
) -> ModelResponse:
    """Make one streamed model request, reporting each thinking and text delta as it arrives.

    Returns the aggregated response (with its usage). Provider failures raise `ModelCallError`
    (the provider's error as its `__cause__`); exceptions raised by the callbacks propagate
    unchanged. One attempt: the provider SDK's own retries are off, the model step retries
    (workers/retries.py).
    """
    settings: ModelSettings = {"max_retries": 0}
    if timeout is not None:
        settings["request_timeout"] = timeout
    parameters = ModelRequestParameters(function_tools=list(tools))
    try:
        async with model_request_stream(
            model, messages, model_settings=settings, model_request_parameters=parameters
        ) as stream:
            async for event in stream:
                delta = _delta(event)
                if delta is None:
                    continue
                callback = on_thinking if delta[0] == "thinking" else on_text
                try:
                    callback(delta[1])
                except Exception as exc:
                    raise _CallbackFailed(exc) from exc
            return stream.get()
    except _CallbackFailed as failed:
        raise failed.error from None
    except ModelCallError:
        raise
    except Exception as exc:
        raise ModelCallError(_call_message(model, exc)) from exc


def dump_message(message: ModelMessage) -> bytes:
    """One message as JSON: one item of a history kept as a Redis list."""
    return _MESSAGE_ADAPTER.dump_json(message)


def load_message(data: bytes | str) -> ModelMessage:
    """One message from `dump_message` JSON."""
    return _MESSAGE_ADAPTER.validate_json(data)


class _CallbackFailed(Exception):
    """Carries a callback's exception past the provider-error handling of `stream_response`."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def _delta(event: ModelResponseStreamEvent) -> tuple[str, str] | None:
    """("thinking" | "text", new content) for a streamed event that adds thinking or text."""
    match event:
        case PartStartEvent(part=ThinkingPart(content=content)) if content:
            return "thinking", content
        case PartStartEvent(part=TextPart(content=content)) if content:
            return "text", content
        case PartDeltaEvent(delta=ThinkingPartDelta(content_delta=content)) if content:
            return "thinking", content
        case PartDeltaEvent(delta=TextPartDelta(content_delta=content)) if content:
            return "text", content
    return None


def _replay_model(name: str, replay_text: str | None, agent_kind: AgentKind) -> FunctionModel:
    """A `FunctionModel` that answers with the script line at the history's response count."""
    source = name.removeprefix(REPLAY_PREFIX)
    if replay_text is None:
        raise ModelConfigError(
            f"model {name!r} needs its replay text; submit it through the client, "
            "which reads the file and ships it with the submission"
        )
    try:
        steps = steps_for(parse_replay(replay_text, source), agent_kind)
    except ReplayError as exc:
        raise ModelConfigError(str(exc)) from None

    async def play(messages: list[ModelMessage], _info: AgentInfo) -> AsyncIterator[Any]:
        position = sum(isinstance(message, ModelResponse) for message in messages)
        if position >= len(steps):
            raise ModelCallError(_exhausted_message(name, agent_kind, len(steps), position))
        for item in _replay_items(steps[position]):
            yield item

    return FunctionModel(stream_function=play, model_name=name)


def _replay_items(step: ReplayStep) -> list[str | DeltaToolCalls | DeltaThinkingCalls]:
    """The stream of one recorded response: thinking, text, then its tool calls, word by word."""
    items: list[str | DeltaToolCalls | DeltaThinkingCalls] = []
    if step.thinking:
        items += [{0: DeltaThinkingPart(content=chunk)} for chunk in _chunks(step.thinking)]
    if step.text:
        items += _chunks(step.text)
    calls = [(CODE_TOOL, {"code": step.code})] if step.code is not None else []
    calls += [(call.name, call.args) for call in step.tool_calls]
    for index, (tool, args) in enumerate(calls):
        call_id = f"replay-{step.line}-{index}"
        items.append({1 + index: DeltaToolCall(tool, json.dumps(args), tool_call_id=call_id)})
    return items


def _chunks(text: str) -> list[str]:
    """`text` split after each run of whitespace, so it streams the way a model streams it."""
    return re.findall(r"\s+|\S+\s*", text)


def _exhausted_message(name: str, agent_kind: AgentKind, count: int, position: int) -> str:
    if count == 0:
        return f'{name} has no lines for subagents; add lines with "agent": "sub"'
    return (
        f"{name} is played out: the {agent_kind} agent asked for response {position + 1} "
        f"but the script has {count} {agent_kind} line(s); add lines, or end the turn "
        "with a line that has no code or tool_calls"
    )


def _config_message(name: str, detail: str) -> str:
    """A one-line fix for pydantic-ai's complaint about a model it cannot set up."""
    variables = list(dict.fromkeys(_ENV_VAR_IN_HINT.findall(detail)))
    if variables:
        return (
            f"cannot use model {name!r}: set {' or '.join(variables)} in the worker's environment"
        )
    return f"cannot use model {name!r}: {_one_line(detail.split(_KEYLESS_HINT_START)[0])}"


def _call_message(model: Model, exc: Exception) -> str:
    """A one-line, secret-free description of a failed model request."""
    label = f"model {model.model_name!r}"
    match exc:
        case ModelRequestTimeout():
            detail = f"no complete response within {exc.timeout:g} s"
        case ModelHTTPError():
            detail = f"HTTP {exc.status_code}: {_body_message(exc.body)}"
        case ModelAPIError():
            detail = exc.message
        case UnexpectedModelBehavior():
            detail = f"unexpected model behaviour: {exc.message}"
        case UserError():
            detail = str(exc).split(_KEYLESS_HINT_START)[0]
        case _:
            detail = f"{type(exc).__name__}: {exc}"
    return f"{label} failed: {_one_line(detail)}"


def _body_message(body: object) -> str:
    """The human part of a provider's error body."""
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error["message"]
        if isinstance(error, str):
            return error
        return json.dumps(body, default=str)
    return str(body) if body is not None else "no details"


def _one_line(text: str) -> str:
    """`text` on one line, capped, with anything that looks like a credential removed."""
    for variable, value in os.environ.items():
        if _SECRET_ENV.search(variable) and len(value) >= 8:
            text = text.replace(value, "[redacted]")
    text = _SECRET_LIKE.sub("[redacted]", " ".join(text.split()))
    return text if len(text) <= _MAX_DETAIL else text[: _MAX_DETAIL - 3] + "..."
