"""Showing approval requests to a person and taking their decision at the keyboard
(`actfleet approvals --interactive` and `actfleet run --approve ask` in a terminal)."""

from __future__ import annotations

import fnmatch
import time
from dataclasses import dataclass, field

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.prompt import Prompt
from rich.syntax import Syntax
from rich.text import Text

from actfleet.broker.approvals import DecisionRefused
from actfleet.broker.records import ApprovalRecord
from actfleet.client.render import SHOWN_REQUESTS
from actfleet.client.sdk import Client

SUBCOMMAND_TOOLS = {"git", "pip", "uv", "npm", "docker", "kubectl", "cargo", "apt", "make"}


def show(console: Console, record: ApprovalRecord) -> None:
    """The request as a panel: exactly what would run."""
    if record.kind == "code":
        body = Syntax(str(record.args.get("code", "")), "python", theme="ansi_dark", word_wrap=True)
    elif record.kind == "shell":
        body = Syntax(str(record.args.get("cmd", "")), "bash", theme="ansi_dark", word_wrap=True)
    else:
        import json

        body = Syntax(json.dumps(record.args, indent=2), "json", theme="ansi_dark")
    expires = ""
    if record.expires_at:
        expires = f" · expires in {max(0, record.expires_at - time.time()):.0f} s"
    title = (
        f"{record.id} · {record.kind}"
        + (f" {record.tool_name}" if record.kind == "tool" else "")
        + f" · {record.session_id}/{record.agent_id}{expires}"
    )
    console.print(
        Panel(
            body,
            title=escape(title),
            title_align="left",
            border_style="magenta",
            subtitle=f"sha256 {record.args_sha256[:16]}…",
            subtitle_align="right",
        )
    )


def subject(record: ApprovalRecord) -> str:
    """What a request is about, in one line: its command, tool or subagent prompt."""
    if record.kind == "shell":
        return f"shell: {record.args.get('cmd', '')}"
    if record.kind == "subagent":
        return f"subagent: {record.args.get('prompt', '')}"
    if record.kind == "tool":
        return f"tool: {record.tool_name}"
    return "code"


def suggest_pattern(record: ApprovalRecord) -> str:
    """A pattern for `a` (approve this and later matching requests), freeact-style."""
    if record.kind == "shell":
        words = str(record.args.get("cmd", "")).split()
        if len(words) >= 2 and words[0] in SUBCOMMAND_TOOLS:
            return f"shell:{words[0]} {words[1]} *"
        return f"shell:{words[0]} *" if words else "shell"
    if record.kind == "tool":
        return f"tool:{record.tool_name}"
    return record.kind


def matches(pattern: str, record: ApprovalRecord) -> bool:
    kind, _, glob = pattern.partition(":")
    if kind != record.kind:
        return False
    subject = {"shell": str(record.args.get("cmd", "")), "tool": record.tool_name}.get(
        record.kind, ""
    )
    return not glob or fnmatch.fnmatchcase(subject, glob)


@dataclass
class Walker:
    """Decides requests one by one: y approve, n reject (with a reason), a approve this and
    every later request of the session matching an editable pattern, q quit.

    A request this process rendered (`actfleet run` in a terminal: its code or command is
    on the screen just above) is asked about without repeating it, and the decision's
    line is left to its event; elsewhere (`actfleet approvals --interactive`) the request
    is shown in full and the decision confirmed."""

    client: Client
    console: Console
    approver: str | None = None
    patterns: dict[str, list[str]] = field(default_factory=dict)
    seen: set[str] = field(default_factory=set)

    def handle(self, record: ApprovalRecord) -> bool:
        """Decide one request; False when the person quits."""
        if record.id in self.seen:
            return True
        self.seen.add(record.id)
        on_screen = record.id in SHOWN_REQUESTS
        for pattern in self.patterns.get(record.session_id, []):
            if matches(pattern, record):
                if not on_screen and record.kind == "code":
                    show(self.console, record)
                self._approve(record, note=f"matches {pattern}", what=subject(record))
                return True
        question = r"approve? \[y]es \[n]o \[a]lways \[q]uit"
        if on_screen:  # the request's line just above names it
            question += _expiry(record)
        else:
            show(self.console, record)
        answer = Prompt.ask(
            question,
            choices=["y", "n", "a", "q"],
            console=self.console,
            show_choices=False,
        )
        if answer == "q":
            return False
        if answer == "y":
            self._approve(record)
        elif answer == "a":
            pattern = Prompt.ask(
                "approve this and later requests of this session matching",
                default=suggest_pattern(record),
                console=self.console,
            )
            self.patterns.setdefault(record.session_id, []).append(pattern)
            self._approve(record, note=f"and later ones matching {pattern}")
        else:
            reason = Prompt.ask("reason (told to the model)", default="", console=self.console)
            try:
                self.client.reject(
                    record.id, args_sha256=record.args_sha256, reason=reason, approver=self.approver
                )
                if not on_screen:
                    self.console.print(Text(f"rejected {record.id}", style="red"))
            except DecisionRefused as exc:
                self.console.print(Text(f"refused: {exc}", style="yellow"))
        return True

    def _approve(self, record: ApprovalRecord, note: str = "", what: str = "") -> None:
        """Approve, recording `note` as the decision's reason; confirmed here unless the
        decision's event will be shown here."""
        try:
            self.client.approve(
                record.id, args_sha256=record.args_sha256, approver=self.approver, reason=note
            )
        except DecisionRefused as exc:
            self.console.print(Text(f"refused: {exc}", style="yellow"))
            return
        if record.id not in SHOWN_REQUESTS:
            line = f"approved {record.id}" + (f" ({what})" if what else "")
            self.console.print(Text(line + (f" · {note}" if note else ""), style="green"))


def _expiry(record: ApprovalRecord) -> str:
    if not record.expires_at:
        return ""
    return f" (expires in {max(0, record.expires_at - time.time()):.0f} s)"
