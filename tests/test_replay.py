"""Replay scripts: parsing, one-line errors that name file and line, subagent filtering."""

from __future__ import annotations

from pathlib import Path

import pytest

from actfleet.broker.replay import (
    ReplayError,
    ReplayStep,
    ReplayToolCall,
    load_replay,
    parse_replay,
    steps_for,
)

SCRIPT = """\
{"thinking": "list the files", "text": "Looking.", "code": "!ls"}

{"agent": "sub", "text": "sub answer"}
{"tool_calls": [{"name": "subagent_task", "args": {"prompt": "count"}}]}
{"text": "Done."}
"""


def test_parse_replay_reads_every_field_and_keeps_line_numbers() -> None:
    steps = parse_replay(SCRIPT, "demo.jsonl")

    assert steps == [
        ReplayStep("list the files", "Looking.", "!ls", (), "main", 1),
        ReplayStep(None, "sub answer", None, (), "sub", 3),
        ReplayStep(
            None, None, None, (ReplayToolCall("subagent_task", {"prompt": "count"}),), "main", 4
        ),
        ReplayStep(None, "Done.", None, (), "main", 5),
    ]


def test_steps_for_keeps_each_agent_kind_in_file_order() -> None:
    steps = parse_replay(SCRIPT, "demo.jsonl")

    assert [step.line for step in steps_for(steps, "main")] == [1, 4, 5]
    assert [step.line for step in steps_for(steps, "sub")] == [3]


def test_tool_call_args_default_to_empty_object() -> None:
    (step,) = parse_replay('{"tool_calls": [{"name": "reset"}]}', "s.jsonl")

    assert step.tool_calls == (ReplayToolCall("reset", {}),)


def test_load_replay_returns_raw_text_and_steps(tmp_path: Path) -> None:
    path = tmp_path / "demo.jsonl"
    path.write_text(SCRIPT)

    text, steps = load_replay(path)

    assert text == SCRIPT
    assert len(steps) == 4


def test_missing_file_error_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.jsonl"

    with pytest.raises(ReplayError, match=r"nope\.jsonl: replay file not found"):
        load_replay(path)


@pytest.mark.parametrize("text", ["", "\n  \n"])
def test_empty_file_is_an_error(text: str) -> None:
    with pytest.raises(ReplayError, match=r"^demo\.jsonl: replay file is empty; expected"):
        parse_replay(text, "demo.jsonl")


def test_file_with_only_subagent_lines_is_an_error() -> None:
    with pytest.raises(ReplayError, match="main agent needs at least one line"):
        parse_replay('{"agent": "sub", "text": "x"}', "demo.jsonl")


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('{"code": 1}', '"code" must be a string, got int'),
        ('{"text": ["a"]}', '"text" must be a string, got list'),
        ('{"thinking": true, "text": "a"}', '"thinking" must be a string, got bool'),
        ('{"text": "a", "colour": "red"}', "unknown key 'colour'; expected only thinking, text"),
        ('{"code": "1"', "invalid JSON"),
        ('["code"]', "expected a JSON object, got list"),
        ('{"agent": "boss", "text": "a"}', '"agent" must be "main" or "sub", got "boss"'),
        ('{"thinking": "hmm"}', 'no "text", "code" or "tool_calls"'),
        ('{"tool_calls": []}', '"tool_calls" must be a non-empty list'),
        ('{"tool_calls": {"name": "x"}}', '"tool_calls" must be a non-empty list'),
        ('{"tool_calls": ["x"]}', "tool_calls[0] must be an object"),
        ('{"tool_calls": [{"args": {}}]}', 'tool_calls[0]: "name" must be a non-empty string'),
        ('{"tool_calls": [{"name": "x", "args": [1]}]}', '"args" must be an object, got list'),
        ('{"tool_calls": [{"name": "x", "id": "1"}]}', "tool_calls[0]: unknown key 'id'"),
    ],
)
def test_malformed_line_error_names_file_and_line(line: str, expected: str) -> None:
    text = '{"code": "print(1)"}\n\n' + line + "\n"

    with pytest.raises(ReplayError) as caught:
        parse_replay(text, "demo.jsonl")

    message = str(caught.value)
    assert message.startswith("demo.jsonl:3: ")
    assert expected in message
    assert "\n" not in message
