"""Events and requests as HTML: markdown responses (raw HTML off), code highlighted by
Pygments on the server, outputs with their head and tail (client/render.py's split)."""

from __future__ import annotations

import json
import re
from typing import Any

from markdown_it import MarkdownIt
from markupsafe import Markup, escape
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import BashLexer, JsonLexer, PythonLexer

from actfleet.broker import events as ev
from actfleet.broker.records import ApprovalRecord
from actfleet.client.render import STOPPED, split_preview, tail_lines
from actfleet.dashboard.pages import templates

_MARKDOWN = MarkdownIt("commonmark", {"html": False})
_FORMATTER = HtmlFormatter(cssclass="hl", nowrap=False)
_LEXERS = {"python": PythonLexer(), "bash": BashLexer(), "json": JsonLexer()}
CHUNKS = (ev.ResponseChunk, ev.ThoughtsChunk, ev.CodeExecutionOutputChunk)

highlight_css = _FORMATTER.get_style_defs(".hl")


def code(source: str, language: str = "python") -> Markup:
    return Markup(highlight(source, _LEXERS[language], _FORMATTER))


def markdown(source: str) -> Markup:
    return Markup(_MARKDOWN.render(source))


def request_code(kind: str, tool_name: str, args: dict[str, Any]) -> Markup:
    """Exactly what a request would run, highlighted."""
    if kind == "code":
        return code(str(args.get("code", "")))
    if kind == "shell":
        return code(str(args.get("cmd", "")), "bash")
    if kind == "subagent":
        return markdown(str(args.get("prompt", "")))
    return code(json.dumps({"tool": tool_name, "args": args}, indent=2, default=str), "json")


def chunk_key(event: ev.Event) -> str:
    """Where a streamed text goes until its complete event replaces it."""
    kind = {"ResponseChunk": "r", "ThoughtsChunk": "t", "CodeExecutionOutputChunk": "o"}
    kind |= {"Response": "r", "Thoughts": "t", "CodeExecutionOutput": "o"}
    return f"{event.agent_id}-{event.turn_id}-{event.corr_id}-{kind.get(event.type, '')}"


def chunk_text(event: ev.Event) -> str:
    return str(getattr(event, "text", None) or getattr(event, "content", ""))


def output_text(text: str, images: list[str]) -> str:
    """A cell's output without the lines linking its images for the model (`![image](...)`):
    the page shows the images themselves."""
    for name in images:
        text = re.sub(rf"^!\[image\]\([^)\n]*/{re.escape(name)}\)\n?", "", text, flags=re.M)
    return text


def event_html(event: ev.Event, read_only: bool) -> str:
    """One event as an HTML fragment for the session page."""
    context: dict[str, Any] = {"e": event, "read_only": read_only, "key": chunk_key(event)}
    match event:
        case ev.Response() | ev.Thoughts():
            context["body"] = markdown(event.content)
        case ev.TurnStarted():
            context["body"] = markdown(event.prompt)
        case ev.CodeAction():
            context["body"] = code(event.code)
        case ev.ToolCall():
            context["body"] = request_code("tool", event.tool_name, event.args)
        case ev.CodeExecutionOutput():
            context["images"] = [p.rsplit("/", 1)[-1] for p in event.images]
            context["text"] = output_text(event.text, context["images"])
            parts = split_preview(context["text"]) if event.truncated else None
            if parts is not None:
                head, tail = parts
                context["head"], context["tail"] = head, "\n".join(tail_lines(tail))
        case ev.ApprovalRequest():
            context["body"] = request_code(event.kind, event.tool_name, event.args)
        case ev.TurnFinished():
            context["why"] = STOPPED.get(event.reason, event.reason)
    return templates.get_template("event.html").render(**context)


def request_html(record: ApprovalRecord, read_only: bool, csrf_token: str) -> str:
    """One pending request as an inbox card."""
    return templates.get_template("request.html").render(
        r=record,
        body=request_code(record.kind, record.tool_name, record.args),
        read_only=read_only,
        csrf_token=csrf_token,
    )


__all__ = ["CHUNKS", "escape", "event_html", "highlight_css", "request_html"]
