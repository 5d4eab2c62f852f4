"""Replay scripts: recorded model responses, one JSON object per line (JSON Lines).

Pure parsing, no pydantic-ai: the client validates a `replay:<file>` model before it ships the
text to the workers, which turn the steps into model responses (`actfleet.workers.models`).

A line is one model response::

    {"thinking": "...", "text": "...", "code": "print(1)"}
    {"tool_calls": [{"name": "subagent_task", "args": {"prompt": "..."}}]}
    {"agent": "sub", "text": "done"}

`code` is one `execute_ipython_cell` call, `tool_calls` are other tool calls, `agent: "sub"`
reserves the line for subagents (default `"main"`). A line with neither `code` nor
`tool_calls` ends the turn. Blank lines are skipped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

AgentKind = Literal["main", "sub"]

_KEYS = ("thinking", "text", "code", "tool_calls", "agent")
_TOOL_CALL_KEYS = ("name", "args")


class ReplayError(ValueError):
    """A replay file is missing or malformed; the message names the file and line."""


@dataclass(frozen=True)
class ReplayToolCall:
    """One tool call of a replayed response."""

    name: str
    args: dict[str, Any]


@dataclass(frozen=True)
class ReplayStep:
    """One recorded model response; `line` is its 1-based line number in the file."""

    thinking: str | None
    text: str | None
    code: str | None
    tool_calls: tuple[ReplayToolCall, ...]
    agent: AgentKind
    line: int = 0


def load_replay(path: str | Path) -> tuple[str, list[ReplayStep]]:
    """Read and parse a replay file; returns the raw text (shipped to workers) and its steps."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ReplayError(
            f"{path}: replay file not found; give the path of a JSON Lines file of model responses"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise ReplayError(
            f"{path}: cannot read replay file ({reason}); expected a UTF-8 JSON Lines file"
        ) from None
    return text, parse_replay(text, str(path))


def parse_replay(text: str, source: str) -> list[ReplayStep]:
    """Parse replay text; `source` names the file in error messages. Only a newline ends a
    line (JSON Lines): a JSON string may hold U+2028 or U+0085 unescaped."""
    steps = [
        _parse_line(raw, source, number)
        for number, raw in enumerate(text.split("\n"), start=1)
        if raw.strip()
    ]
    if not steps:
        raise ReplayError(
            f"{source}: replay file is empty; expected one JSON object per line, "
            'e.g. {"code": "print(1)"} then {"text": "done"}'
        )
    if not steps_for(steps, "main"):
        raise ReplayError(
            f'{source}: every line has "agent": "sub"; the main agent needs at least one line'
        )
    return steps


def steps_for(steps: list[ReplayStep], agent_kind: AgentKind) -> list[ReplayStep]:
    """The steps an agent of this kind plays, in file order."""
    if agent_kind not in ("main", "sub"):
        raise ValueError(f"agent_kind must be 'main' or 'sub', got {agent_kind!r}")
    return [step for step in steps if step.agent == agent_kind]


def _parse_line(raw: str, source: str, number: int) -> ReplayStep:
    where = f"{source}:{number}"
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ReplayError(
            f"{where}: invalid JSON ({exc.msg} at column {exc.colno}); "
            "expected one JSON object per line"
        ) from None
    except (ValueError, RecursionError) as exc:
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)[:80]
        raise ReplayError(
            f"{where}: unreadable JSON ({reason}); expected one JSON object per line"
        ) from None
    if not isinstance(obj, dict):
        raise ReplayError(f"{where}: expected a JSON object, got {_kind(obj)}")
    unknown = sorted(set(obj) - set(_KEYS))
    if unknown:
        raise ReplayError(f"{where}: unknown key {unknown[0]!r}; expected only {', '.join(_KEYS)}")

    thinking = _optional_str(obj, "thinking", where)
    text = _optional_str(obj, "text", where)
    code = _optional_str(obj, "code", where)
    tool_calls = _tool_calls(obj.get("tool_calls"), where) if "tool_calls" in obj else ()
    agent = obj.get("agent", "main")
    if agent not in ("main", "sub"):
        raise ReplayError(f'{where}: "agent" must be "main" or "sub", got {json.dumps(agent)}')
    if text is None and code is None and not tool_calls:
        raise ReplayError(
            f'{where}: response has no "text", "code" or "tool_calls"; give at least one'
        )
    return ReplayStep(thinking, text, code, tool_calls, agent, number)


def _optional_str(obj: dict[str, Any], key: str, where: str) -> str | None:
    value = obj.get(key)
    if value is not None and not isinstance(value, str):
        raise ReplayError(f'{where}: "{key}" must be a string, got {_kind(value)}')
    return value


def _tool_calls(value: Any, where: str) -> tuple[ReplayToolCall, ...]:
    if not isinstance(value, list) or not value:
        raise ReplayError(
            f'{where}: "tool_calls" must be a non-empty list of {{"name": ..., "args": {{...}}}}, '
            f"got {_kind(value)}"
        )
    calls = []
    for index, item in enumerate(value):
        at = f"{where}: tool_calls[{index}]"
        if not isinstance(item, dict):
            raise ReplayError(
                f'{at} must be an object {{"name": ..., "args": {{...}}}}, got {_kind(item)}'
            )
        unknown = sorted(set(item) - set(_TOOL_CALL_KEYS))
        if unknown:
            raise ReplayError(f"{at}: unknown key {unknown[0]!r}; expected only name, args")
        name = item.get("name")
        if not isinstance(name, str) or not name:
            raise ReplayError(f'{at}: "name" must be a non-empty string, got {_kind(name)}')
        args = item.get("args", {})
        if not isinstance(args, dict):
            raise ReplayError(f'{at}: "args" must be an object, got {_kind(args)}')
        calls.append(ReplayToolCall(name, args))
    return tuple(calls)


def _kind(value: Any) -> str:
    """The JSON-ish name of a decoded value's type, for error messages."""
    match value:
        case None:
            return "null"
        case bool():
            return "bool"
        case int():
            return "int"
        case float():
            return "float"
        case str():
            return "string" if value else "empty string"
        case list():
            return "list" if value else "empty list"
        case dict():
            return "object"
    return type(value).__name__
