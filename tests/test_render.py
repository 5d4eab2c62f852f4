"""What a person sees: events rendered to a recording console, and the CLI's output with
real nodes and kernels (a long output's head, elision and tail; subagents' labels; the
inline approval flow)."""

from __future__ import annotations

import io
import os
import re
import sys
from pathlib import Path

import pexpect
import pytest
from rich.console import Console

from actfleet.broker import events as ev
from actfleet.broker.records import ApprovalRecord
from actfleet.client import Client
from actfleet.client.approval_prompt import Walker
from actfleet.client.render import Renderer
from tests.conftest import cli, write_replay

ENV = {"session_id": "s1", "turn_id": "t1"}


def rendered(*events: ev.Event, width: int = 100) -> str:
    console = Console(record=True, width=width, highlight=False, force_terminal=False)
    renderer = Renderer(console)
    for event in events:
        renderer.show(event)
    return console.export_text()


# ---- rendering, event by event --------------------------------------------------------


def test_a_tool_call_with_bytes_in_its_arguments_is_shown_not_a_crash():
    text = rendered(ev.ToolCall(**ENV, corr_id="c1", tool_name="t", args={"x": b"\xffok"}))
    assert text.startswith('tool call t {"x": "') and 'ok"}' in text


def test_cell_output_and_answers_are_framed():
    text = rendered(
        ev.CodeExecutionOutputChunk(**ENV, corr_id="c1", text="4"),
        ev.CodeExecutionOutputChunk(**ENV, corr_id="c1", text="2\n"),
        ev.CodeExecutionOutput(**ENV, corr_id="c1", text="42\n", lines=1),
        ev.CodeExecutionOutput(**ENV, corr_id="c2", text="boom\n", status="error", lines=1),
        ev.Response(**ENV, content="It is **42**."),
    )
    assert "┌ output\n│ 42\n└\n" in text
    assert "┌ output\n│ boom\n└ error\n" in text
    assert re.search(r"╭─ response ─+╮\n│ It is 42\. +│\n╰─+╯", text)


def test_one_request_is_counted_in_the_singular():
    usage = {"input_tokens": 5, "output_tokens": 2, "requests": 1, "cost": 0.5}
    assert "· 1 request ·" in rendered(ev.TurnFinished(**ENV, usage=usage))
    usage["requests"] = 3
    assert "· 3 requests ·" in rendered(ev.TurnFinished(**ENV, usage=usage))


def test_cost_is_shown_in_dollars_and_an_unknown_cost_as_unknown_never_zero():
    priced = {"input_tokens": 5, "output_tokens": 2, "requests": 1, "cost": 0.0123}
    unknown = {**priced, "cost": None, "unpriced": 1}
    partly = {**priced, "requests": 3, "unpriced": 2}

    assert "tokens · 1 request · cost $0.0123\n" in rendered(ev.TurnFinished(**ENV, usage=priced))
    assert "· cost unknown\n" in rendered(ev.TurnFinished(**ENV, usage=unknown))
    assert "$0" not in rendered(ev.TurnFinished(**ENV, usage=unknown))
    assert "cost ≥ $0.0123 (2 steps of unknown price)" in rendered(
        ev.TurnFinished(**ENV, usage=partly)
    )
    failed = ev.TurnFailed(**ENV, error="model 'x' failed: HTTP 401", usage=unknown, attempts=1)
    assert "✗ turn failed: model 'x' failed: HTTP 401 · 5 in / 2 out" in rendered(failed)


def test_a_retry_is_shown_with_its_attempt_delay_and_error_and_attempts_in_the_last_line():
    retry = ev.ModelRetry(
        **ENV, attempt=1, max_attempts=5, delay=0.25, error="HTTP 429: slow down", discarded=True
    )
    usage = {"input_tokens": 5, "output_tokens": 2, "requests": 1, "cost": None, "unpriced": 1}
    text = rendered(retry, ev.TurnFinished(**ENV, usage=usage, attempts=2), width=160)

    assert "model request failed (attempt 1 of 5), retrying in 0.2 s: HTTP 429: slow down" in text
    assert "(what it had streamed is discarded)" in text
    assert "cost unknown · 2 attempts\n" in text


def test_a_long_model_name_is_shown_whole_below_the_turn_rule():
    model = "replay:/opt/venv/lib/python3.12/site-packages/actfleet/examples/csv_stats.jsonl"
    text = rendered(ev.TurnStarted(**ENV, prompt="go", model=model), width=80)
    assert f"model {model}" in text.replace("\n", "")
    assert "─ turn t1 ─" in text
    short = rendered(ev.TurnStarted(**ENV, prompt="go", model="openai-chat:gpt-4o"), width=80)
    assert "turn t1 · openai-chat:gpt-4o" in short


def test_decisions_name_their_request_once():
    text = rendered(
        ev.ApprovalDecision(**ENV, request_id="a-1", approved=True, approver="root"),
        ev.ApprovalDecision(
            **ENV, request_id="a-2", approved=False, approver="erin", reason="not today"
        ),
    )
    assert text == "✓ a-1 approved by root\n✗ a-2 rejected by erin: not today\n"


class _Decisions:
    """A client that records approvals (the walker's side only)."""

    def __init__(self) -> None:
        self.approved: list[tuple[str, str]] = []

    def approve(self, request_id: str, *, args_sha256: str, approver=None, reason="") -> None:  # noqa: ANN001
        self.approved.append((request_id, reason))


def test_a_pattern_approval_shows_what_it_approved():
    console = Console(record=True, width=100, highlight=False)
    decisions = _Decisions()
    walker = Walker(decisions, console)  # type: ignore[arg-type]
    walker.patterns["s1"] = ["shell:echo *"]
    record = ApprovalRecord.new(
        session_id="s1",
        agent_id="main",
        turn_id="t1",
        kind="shell",
        tool_name="shell",
        args={"cmd": "echo two"},
        timeout=None,
    )
    assert walker.handle(record)
    assert decisions.approved == [(record.id, "matches shell:echo *")]
    assert (
        console.export_text() == f"approved {record.id} (shell: echo two) · matches shell:echo *\n"
    )


# ---- through the CLI, with real nodes -------------------------------------------------


@pytest.fixture(scope="module")
def fleet(redis_server: str, tmp_path_factory: pytest.TempPathFactory):
    from tests.conftest import Fleet, new_db_url

    fleet = Fleet(new_db_url(redis_server), tmp_path_factory.mktemp("fleet"))
    try:
        fleet.start("r1", "--concurrency", "4")
        yield fleet
    finally:
        fleet.stop()


LONG = (
    "for i in range(5000):\n    print(f'line {i:05d} ' + 'x' * 20)\nprint('FINAL RESULT 42'); 1/0"
)


def test_a_long_output_shows_head_elision_with_count_and_command_then_tail_with_traceback(
    fleet, tmp_path: Path
):
    replay = write_replay(tmp_path / "r.jsonl", {"code": LONG}, {"text": "done"})
    proc = cli(fleet.redis_url, "run", "long", "--model", f"replay:{replay}", "--approve", "auto")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    elision = next(i for i, line in enumerate(lines) if "lines omitted" in line)
    found = re.fullmatch(
        r"│ … ([\d,]+) lines omitted \(actfleet output (\S+) prints all\) …", lines[elision]
    )
    assert found, lines[elision]
    omitted, ref = int(found[1].replace(",", "")), found[2]
    head = [line for line in lines[:elision] if line.startswith("│ line ")]
    tail = lines[elision + 1 : lines.index("└ error", elision)]
    assert head[0] == "│ line 00000 " + "x" * 20
    assert "│ FINAL RESULT 42" in tail and tail[-1] == "│ ZeroDivisionError: division by zero"
    assert tail[0] == "│ line 04989 " + "x" * 20
    assert len(head) + omitted + tail.index("│ FINAL RESULT 42") == 5000

    whole = cli(fleet.redis_url, "output", ref)
    assert whole.returncode == 0, whole.stderr
    printed = whole.stdout.splitlines()
    assert printed[0] == "line 00000 " + "x" * 20 and printed[4999] == "line 04999 " + "x" * 20
    assert (
        printed[5000] == "FINAL RESULT 42" and printed[-1] == "ZeroDivisionError: division by zero"
    )
    assert len(printed) == len(head) + omitted + len(tail)
    assert Client(fleet.redis_url).output(ref) == whole.stdout


def test_output_of_an_unknown_ref_exits_3_naming_it(fleet):
    proc = cli(fleet.redis_url, "output", "s-x:t-y:main:nope")
    assert proc.returncode == 3 and "no stored output 's-x:t-y:main:nope'" in proc.stderr


def test_parallel_subagents_are_labelled_in_the_terminal(fleet, tmp_path: Path):
    replay = write_replay(
        tmp_path / "r.jsonl",
        {
            "tool_calls": [
                {"name": "subagent_task", "args": {"prompt": "first"}},
                {"name": "subagent_task", "args": {"prompt": "second"}},
            ]
        },
        {"text": "both done"},
        {"agent": "sub", "code": "print('from a subagent')"},
        {"agent": "sub", "text": "sub done"},
    )
    proc = cli(fleet.redis_url, "run", "fan", "--model", f"replay:{replay}", "--approve", "auto")
    assert proc.returncode == 0, proc.stderr
    subs = re.findall(r"↳ (sub-[0-9a-f]{8}) started", proc.stdout)
    assert len(set(subs)) == 2
    for sub in subs:
        assert re.search(rf"╭─ \[{sub}\] code ─", proc.stdout), proc.stdout
        assert f"┌ [{sub}] output\n│ from a subagent\n" in proc.stdout
        assert re.search(rf"╭─ \[{sub}\] response ─", proc.stdout)


def in_terminal(redis_url: str, *args: str) -> pexpect.spawn:
    env = {**os.environ, "ACTFLEET_REDIS_URL": redis_url, "COLUMNS": "100", "NO_COLOR": "1"}
    return pexpect.spawn(
        sys.executable, ["-m", "actfleet", *args], env=env, encoding="utf-8", timeout=30
    )


def test_run_asks_without_repeating_the_code_and_says_each_decision_once(fleet, tmp_path: Path):
    replay = write_replay(
        tmp_path / "r.jsonl",
        {"code": "print('approved cell')"},
        {"code": "print('rejected cell')"},
        {"text": "n/a"},
    )
    log = io.StringIO()
    run = in_terminal(fleet.redis_url, "run", "ask me", "--model", f"replay:{replay}")
    run.logfile_read = log
    run.expect(r"approve\?")
    run.sendline("y")
    run.expect(r"approve\?")
    run.sendline("n")
    run.expect("reason")
    run.sendline("not today")
    run.expect(pexpect.EOF)
    run.close()
    out = (
        re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", log.getvalue())
        .replace("\r\n", "\n")
        .replace("\r", "\n")
    )
    assert out.count("print('approved cell')") == out.count("print('rejected cell')") == 1
    assert len(re.findall(r"approved (?:by|a-)", out)) == 1
    assert re.search(r"^✓ a-\w+ approved by \S+$", out, re.M)
    assert len(re.findall(r"rejected (?:by|a-)", out)) == 1
    assert re.search(r"^✗ a-\w+ rejected by \S+: not today$", out, re.M)
    assert re.search(r"^│ \[actfleet\] Rejected by \S+: not today\. Nothing of", out, re.M)
    assert "(rejected) by" not in out and "1 requests" not in out
