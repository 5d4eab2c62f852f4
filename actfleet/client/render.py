"""How events look to a person (rich) and to a program (one JSON object per line)."""

from __future__ import annotations

import json
import re
import sys
from typing import Any

from rich.console import Console
from rich.markdown import Markdown
from rich.markup import escape
from rich.panel import Panel
from rich.syntax import Syntax
from rich.text import Text

from actfleet.broker import events as ev

STOPPED = {
    "rejected": "a request was rejected (rejected)",
    "max_turns": "stopped by its --max-turns limit (max_turns)",
    "budget": "stopped by its budget, --max-cost or --max-tokens (budget)",
}
"""What a TurnFinished `reason` other than completed means, for a person."""

SHOWN_REQUESTS: set[str] = set()
"""Approval requests rendered by this process, below the code or call they ask about: an
approval prompt in the same terminal (approval_prompt.py) refers to them instead of
printing them again, and leaves the decision's line to the decision's event."""

TAIL_LINES = 20
"""Lines of a truncated output shown after the elision (more when a traceback starts
earlier in the kept tail: the whole traceback is shown)."""

_OMITTED = re.compile(r"\n\[\.\.\. \d+ bytes of output omitted \.\.\.\]\n")
"""The marker between the head and the tail of a truncated output's preview."""
_TRACEBACK = re.compile(r"^(?:-{20,}|Traceback \(most recent call last\))")
_LINES = re.compile(r"[^\n]*\n|[^\n]+")
_FRAME = "dim"


def json_line(item: ev.Event | dict[str, Any]) -> str:
    """One JSON line for an event (with `type` and `id`) or a plain record."""
    data = item.to_dict() if isinstance(item, ev.Event) else item
    return json.dumps(data, ensure_ascii=False, default=_bytes_as_text)


def _bytes_as_text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    raise TypeError(f"cannot encode {type(value).__name__}")


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def split_preview(text: str) -> tuple[str, str] | None:
    """The head and the tail of a truncated output's preview (the tail from its first whole
    line), or None when `text` has no omission marker."""
    match = _OMITTED.search(text)
    if match is None:
        return None
    tail = text[match.end() :]
    return text[: match.start()], tail.split("\n", 1)[1] if "\n" in tail else ""


def tail_lines(tail: str) -> list[str]:
    """The last TAIL_LINES lines of `tail`, from an earlier traceback's start if there is one."""
    lines = tail.rstrip("\n").split("\n") if tail.strip() else []
    start = max(len(lines) - TAIL_LINES, 0)
    starts = [i for i, line in enumerate(lines) if _TRACEBACK.match(line)]
    if starts and starts[-1] < start:
        start = starts[-1]
    return lines[start:]


def usage_text(usage: dict[str, Any], attempts: int = 1) -> str:
    """A turn's usage for a person: tokens, requests, cost ("cost unknown" when no step had
    a known price, never $0), and the attempts when requests were retried."""
    used = (
        f"{usage.get('input_tokens', 0)} in / {usage.get('output_tokens', 0)} out "
        f"tokens · {plural(usage.get('requests', 0), 'request')} · {cost_text(usage)}"
    )
    return used + (f" · {attempts} attempts" if attempts > 1 else "")


def cost_text(usage: dict[str, Any]) -> str:
    """`cost $0.0123`; `cost unknown`; or, with some steps unpriced, the known part as a
    lower bound."""
    cost, unpriced = usage.get("cost"), usage.get("unpriced") or 0
    if not isinstance(cost, int | float):
        return "cost unknown"
    shown = f"${cost:.4f}" if cost == 0 or cost >= 0.001 else f"${cost:.6f}"
    if unpriced:
        return f"cost ≥ {shown} ({plural(unpriced, 'step')} of unknown price)"
    return f"cost {shown}"


def _key(event: ev.Event, kind: str) -> str:
    """What a streamed text and its complete event share: the agent, the turn, the call
    (or step), and "o" (output) or "t" (thoughts). Subagents of one replay share call ids."""
    return f"{event.agent_id}/{event.turn_id}/{event.corr_id}/{kind}"


def line_count(text: str) -> int:
    return text.count("\n") + (not text.endswith("\n") and bool(text))


class Renderer:
    """Prints events for a person: answers in a panel as markdown, code highlighted in a
    panel, outputs framed as they stream (a truncated one as head, elision and tail).
    Streamed chunks are shown live; the complete event then only closes them. Subagents'
    events are labelled with their id."""

    def __init__(self, console: Console | None = None):
        self.console = console or Console(highlight=False)
        self._streamed: dict[str, str] = {}
        """Chunk key (`_key`) -> the text shown live."""
        self._open: str = ""
        self._at_line_start = True

    def show(self, event: ev.Event) -> None:
        who = "" if event.agent_id == "main" else f"[{event.agent_id}] "
        match event:
            case ev.ThoughtsChunk() | ev.ResponseChunk() | ev.CodeExecutionOutputChunk():
                self._chunk(event, who)
                return
            case ev.CodeExecutionOutput():
                self._output(event, who)
                return
        self._close_chunk()
        c = self.console
        match event:
            case ev.TurnStarted():
                self._turn_header(who, event)
                c.print(Text(f"> {event.prompt}", style="bold"))
            case ev.Thoughts():
                if _key(event, "t") not in self._streamed:
                    c.print(Text(event.content, style="dim italic"))
            case ev.Response():
                c.print(
                    Panel(
                        Markdown(event.content),
                        title=escape(f"{who}response"),
                        title_align="left",
                        border_style="green",
                    )
                )
            case ev.CodeAction():
                c.print(
                    Panel(
                        Syntax(event.code, "python", theme="ansi_dark", word_wrap=True),
                        title=escape(f"{who}code"),
                        title_align="left",
                        border_style="blue",
                    )
                )
            case ev.ToolCall():
                c.print(
                    Text.assemble(
                        f"{who}tool call ",
                        (event.tool_name, "bold"),
                        f" {json.dumps(event.args, default=_bytes_as_text)}",
                    )
                )
            case ev.ToolOutput() if event.tool_name == "subagent_task":
                pass  # shown by SubagentFinished
            case ev.ToolOutput():
                self._frame_start(f"{who}{event.tool_name}")
                self._frame_lines(event.content.rstrip("\n").split("\n"))
                self._frame_end("")
            case ev.Unreadable():
                c.print(Text(f"[unreadable stream entry skipped: {event.reason}]", style="yellow"))
            case ev.KernelRestarted():
                c.print(Text(f"{who}kernel restarted: {event.reason}", style="yellow"))
            case ev.SubagentStarted():
                c.print(Text(f"↳ {event.subagent_id} started: {event.prompt}", style="cyan"))
            case ev.SubagentFinished():
                c.print(
                    Text(f"↳ {event.subagent_id} {event.status}: {event.response}", style="cyan")
                )
            case ev.ApprovalRequest():
                SHOWN_REQUESTS.add(event.request_id)
                subject = event.args.get("cmd") or event.tool_name
                c.print(
                    Text(
                        f"{who}? approval {event.request_id} ({event.kind}"
                        + (f": {subject}" if event.kind != "code" else "")
                        + ") waits for a decision",
                        style="magenta",
                    )
                )
            case ev.ApprovalDecision():
                why = f": {event.reason}" if event.reason else ""
                if not event.request_id:  # refused by a deny rule, nobody asked
                    line = f"{who}✗ refused{why}"
                elif event.approved:
                    line = f"{who}✓ {event.request_id} approved by {event.approver}{why}"
                else:
                    line = f"{who}✗ {event.request_id} rejected by {event.approver}{why}"
                c.print(Text(line, style="magenta"))
            case ev.Usage():
                pass
            case ev.ModelRetry():
                line = (
                    f"{who}model request failed (attempt {event.attempt} of "
                    f"{event.max_attempts}), retrying in {event.delay:.1f} s: {event.error}"
                )
                if event.discarded:
                    line += " (what it had streamed is discarded)"
                c.print(Text(line, style="yellow"))
            case ev.TurnFinished():
                used = usage_text(event.usage, event.attempts)
                if event.reason == "completed":
                    c.print(Text(f"{who}✓ turn completed · {used}", style="green"))
                else:
                    why = STOPPED.get(event.reason, event.reason)
                    c.print(Text(f"{who}✗ turn not completed: {why} · {used}", style="bold yellow"))
            case ev.TurnFailed():
                used = usage_text(event.usage, event.attempts)
                c.print(Text(f"{who}✗ turn failed: {event.error} · {used}", style="bold red"))
            case ev.Cancelled():
                c.print(Text(f"{who}cancelled ({event.phase})", style="yellow"))
            case _:
                c.print(Text(f"{who}{event.type}", style="dim"))

    def _turn_header(self, who: str, event: ev.TurnStarted) -> None:
        """A rule naming the turn and its model; a model too long for the rule (a replay
        file's path) goes on a line of its own, whole."""
        title = f"{who}turn {event.turn_id} · {event.model}"
        if len(title) + 8 <= self.console.width:
            self.console.rule(Text(title), style="cyan")
            return
        self.console.rule(Text(f"{who}turn {event.turn_id}"), style="cyan")
        self.console.print(Text(f"model {event.model}", style="cyan"), overflow="fold")

    def _chunk(self, event: ev.Event, who: str) -> None:
        if isinstance(event, ev.CodeExecutionOutputChunk):
            key = _key(event, "o")
            if self._open != key:
                self._close_chunk()
                continued = key in self._streamed
                self._frame_start(f"{who}output" + (" (continued)" if continued else ""))
                self._open = key
            self._streamed[key] = self._streamed.get(key, "") + event.text
            self._frame_write(event.text)
        elif isinstance(event, ev.ThoughtsChunk):
            key = _key(event, "t")
            if self._open != key:
                self._close_chunk()
                self._open = key
            self._streamed[key] = self._streamed.get(key, "") + event.content
            self._at_line_start = event.content.endswith("\n")
            self.console.print(Text(event.content, style="dim italic"), end="")
        # Answers are shown once, complete, as markdown.
        sys.stdout.flush()

    def _output(self, event: ev.CodeExecutionOutput, who: str) -> None:
        """A cell's result below what streamed of it: a truncated output's elision (with
        the count and the command that prints it all) and its tail; the status."""
        key = _key(event, "o")
        streamed = self._streamed.get(key)
        preview = split_preview(event.text) if event.truncated else None
        if streamed is None and not event.text and event.status == "ok":
            self._close_chunk()
            return
        reopen = self._open != key
        more = streamed is None or preview is not None
        if reopen:
            self._close_chunk()
            if more:
                continued = " (continued)" if streamed is not None else ""
                self._frame_start(f"{who}output{continued}")
        elif not self._at_line_start:
            self.console.print()
        self._open = ""
        self._at_line_start = True
        if streamed is None:
            head = preview[0] if preview else event.text
            self._frame_lines(head.rstrip("\n").split("\n") if head else [])
            streamed = head
        if preview is not None:
            tail = tail_lines(preview[1])
            omitted = max(event.lines - line_count(streamed) - len(tail), 0)
            where = (
                f"actfleet output {event.output_ref} prints all"
                if event.output_ref
                else "the full output was not kept"
            )
            count = f"{omitted:,} lines" if event.lines else "lines"  # an older writer's event
            self._frame_lines([f"… {count} omitted ({where}) …"], style="yellow")
            self._frame_lines(tail)
        status = "" if event.status == "ok" else event.status
        self._frame_end(status, f"{who}output" if reopen and not more else "")

    def _frame_start(self, title: str) -> None:
        self.console.print(Text.assemble(("┌ ", _FRAME), (title, "bold")))
        self._at_line_start = True

    def _frame_write(self, text: str) -> None:
        """Streamed text inside a frame: every line starts with the frame's edge."""
        for piece in _LINES.findall(text):
            if self._at_line_start:
                self.console.print(Text("│ ", style=_FRAME), end="")
            self.console.print(Text(piece), end="")
            self._at_line_start = piece.endswith("\n")

    def _frame_lines(self, lines: list[str], style: str = "") -> None:
        for line in lines:
            self.console.print(Text.assemble(("│ ", _FRAME), (line, style)))

    def _frame_end(self, status: str, label: str = "") -> None:
        """The frame's last line: its label when it closes a frame opened further up, and
        the status unless ok."""
        self.console.print(
            Text.assemble(
                ("└", _FRAME),
                (f" {label}" if label else "", "bold"),
                (" ·" if label and status else "", _FRAME),
                (f" {status}" if status else "", "yellow"),
            )
        )

    def _close_chunk(self) -> None:
        if self._open and not self._at_line_start:
            self.console.print()
        self._at_line_start = True
        self._open = ""
