"""How events look to a person (rich) and to a program (one JSON object per line)."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console
from rich.markdown import Markdown
from rich.panel import Panel
from rich.syntax import Syntax
from rich.text import Text

from actfleet.broker import events as ev

STOPPED = {
    "rejected": "a request was rejected (rejected)",
    "max_turns": "stopped by its --max-turns limit (max_turns)",
}
"""What a TurnFinished `reason` other than completed means, for a person."""


def json_line(item: ev.Event | dict[str, Any]) -> str:
    """One JSON line for an event (with `type` and `id`) or a plain record."""
    data = item.to_dict() if isinstance(item, ev.Event) else item
    return json.dumps(data, ensure_ascii=False, default=_bytes_as_text)


def _bytes_as_text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    raise TypeError(f"cannot encode {type(value).__name__}")


class Renderer:
    """Prints events for a person: markdown answers, highlighted code, outputs as they
    stream. Streamed chunks are shown live; the complete event then only closes them."""

    def __init__(self, console: Console | None = None):
        self.console = console or Console(highlight=False)
        self._streamed: set[str] = set()
        self._open: str = ""
        self._at_line_start = True

    def show(self, event: ev.Event) -> None:
        who = "" if event.agent_id == "main" else f"[{event.agent_id}] "
        match event:
            case ev.ThoughtsChunk() | ev.ResponseChunk() | ev.CodeExecutionOutputChunk():
                self._chunk(event)
                return
        self._close_chunk()
        c = self.console
        match event:
            case ev.TurnStarted():
                c.rule(f"{who}turn {event.turn_id} · {event.model}", style="cyan")
                c.print(Text(f"> {event.prompt}", style="bold"))
            case ev.Thoughts():
                if event.corr_id + "t" not in self._streamed:
                    c.print(Text(event.content, style="dim italic"))
            case ev.Response():
                c.print(Markdown(event.content))
            case ev.CodeAction():
                c.print(
                    Panel(
                        Syntax(event.code, "python", theme="ansi_dark", word_wrap=True),
                        title=f"{who}code",
                        title_align="left",
                        border_style="blue",
                    )
                )
            case ev.ToolCall():
                c.print(f"{who}tool call [bold]{event.tool_name}[/] {json.dumps(event.args)}")
            case ev.CodeExecutionOutput():
                if event.corr_id + "o" not in self._streamed and event.text:
                    c.print(Text(event.text.rstrip("\n")))
                if event.status != "ok" or event.truncated:
                    note = event.status + (", truncated" if event.truncated else "")
                    c.print(Text(f"[{note}]", style="yellow"))
            case ev.ToolOutput() if event.tool_name == "subagent_task":
                pass  # shown by SubagentFinished
            case ev.ToolOutput():
                c.print(Text(f"{event.tool_name} → {event.content}"))
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
                verdict = "approved" if event.approved else "rejected"
                why = f": {event.reason}" if event.reason else ""
                c.print(Text(f"{who}{verdict} by {event.approver}{why}", style="magenta"))
            case ev.Usage():
                pass
            case ev.TurnFinished():
                u = event.usage
                used = (
                    f"{u.get('input_tokens', 0)} in / {u.get('output_tokens', 0)} out "
                    f"tokens · {u.get('requests', 0)} requests"
                )
                if event.reason == "completed":
                    c.print(Text(f"{who}✓ turn completed · {used}", style="green"))
                else:
                    why = STOPPED.get(event.reason, event.reason)
                    c.print(Text(f"{who}✗ turn not completed: {why} · {used}", style="bold yellow"))
            case ev.TurnFailed():
                c.print(Text(f"{who}✗ turn failed: {event.error}", style="bold red"))
            case ev.Cancelled():
                c.print(Text(f"{who}cancelled ({event.phase})", style="yellow"))
            case _:
                c.print(Text(f"{who}{event.type}", style="dim"))

    def _chunk(self, event: ev.Event) -> None:
        if isinstance(event, ev.CodeExecutionOutputChunk):
            key, body, style = event.corr_id + "o", event.text, ""
        elif isinstance(event, ev.ThoughtsChunk):
            key, body, style = event.corr_id + "t", event.content, "dim italic"
        else:
            # Answers are shown once, complete, as markdown.
            return
        if self._open and self._open != key:
            self._close_chunk()
        self._open = key
        self._streamed.add(key)
        self._at_line_start = body.endswith("\n")
        self.console.print(Text(body, style=style), end="")
        sys.stdout.flush()

    def _close_chunk(self) -> None:
        if self._open and not self._at_line_start:
            self.console.print()
        self._open = ""
