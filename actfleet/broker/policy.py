"""Approval policies: which actions run, which need a human, which are refused.

A policy is `auto`, `ask` or rules (TOML, up to three lists `deny`, `ask`, `allow`; entries
`KIND` or `KIND:GLOB`). `deny` is checked first, then `ask`, then `allow`; no match asks.
Pure code: the client checks a rules file at submission, the workers apply it.
"""

from __future__ import annotations

import fnmatch
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

KINDS = ("code", "shell", "tool", "subagent")
MODES = ("auto", "ask", "rules")
Verdict = Literal["allow", "ask", "deny"]


class PolicyError(ValueError):
    """A policy that cannot be used (the message names the file and the entry at fault)."""


@dataclass(frozen=True)
class Rule:
    kind: str
    glob: str = ""

    def matches(self, kind: str, subject: str) -> bool:
        return self.kind == kind and (not self.glob or fnmatch.fnmatchcase(subject, self.glob))

    def __str__(self) -> str:
        return f"{self.kind}:{self.glob}" if self.glob else self.kind


@dataclass(frozen=True)
class Policy:
    """`mode` auto or ask, or rules."""

    mode: Literal["auto", "ask", "rules"] = "ask"
    deny: tuple[Rule, ...] = ()
    ask: tuple[Rule, ...] = ()
    allow: tuple[Rule, ...] = ()

    def decide(self, kind: str, subject: str) -> tuple[Verdict, str]:
        """The verdict for one action and the rule that gave it ("" for auto/ask/no match).
        `subject` is the shell command, the tool name, the code or the subagent prompt."""
        if self.mode == "auto":
            return "allow", ""
        if self.mode == "ask":
            return "ask", ""
        for verdict, rules in (("deny", self.deny), ("ask", self.ask), ("allow", self.allow)):
            for rule in rules:
                if rule.matches(kind, subject):
                    return verdict, str(rule)  # type: ignore[return-value]
        return "ask", ""

    def to_data(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            **{name: [str(r) for r in getattr(self, name)] for name in ("deny", "ask", "allow")},
        }

    @classmethod
    def from_data(cls, data: object) -> Policy:
        """The policy of `to_data` (as a submission carries it); PolicyError for anything else."""
        if not isinstance(data, dict):
            raise PolicyError(f"a policy must be an object, got {type(data).__name__}")
        mode = data.get("mode", "ask")
        if mode not in MODES:
            raise PolicyError(f"unknown policy mode {repr(mode)[:40]}; use {', '.join(MODES)}")
        lists: dict[str, tuple[Rule, ...]] = {}
        for name in ("deny", "ask", "allow"):
            entries = data.get(name, ())
            if not isinstance(entries, list | tuple):
                raise PolicyError(f"policy {name} must be a list, got {type(entries).__name__}")
            lists[name] = tuple(_rule(e, "policy", name) for e in entries)
        return cls(mode=mode, **lists)


def load_policy(spec: str) -> Policy:
    """`auto`, `ask`, or the path of a rules file; a bad file raises PolicyError."""
    if spec in ("auto", "ask"):
        return Policy(mode=spec)  # type: ignore[arg-type]
    path = Path(spec)
    if not path.is_file():
        raise PolicyError(
            f"--approve {spec!r}: not auto, ask, or a rules file that exists; give a TOML file "
            'with deny / ask / allow lists, e.g. allow = ["code", "shell:ls*"]'
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not UTF-8"
        raise PolicyError(
            f"{path}: cannot read the rules file ({reason}); give a UTF-8 TOML file"
        ) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"{path}: {exc}; fix the TOML syntax") from None
    except (ValueError, RecursionError) as exc:
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)[:80]
        raise PolicyError(f"{path}: unreadable TOML ({reason}); fix the value") from None
    unknown = set(data) - {"deny", "ask", "allow"}
    if unknown:
        name = sorted(unknown)[0]
        raise PolicyError(
            f"{path}:{_line_of(text, name)}: unknown key {name!r}; the keys are deny, ask and allow"
        )
    lists: dict[str, tuple[Rule, ...]] = {}
    for name in ("deny", "ask", "allow"):
        entries = data.get(name, [])
        where = f"{path}:{_line_of(text, name)}"
        if not isinstance(entries, list):
            raise PolicyError(f'{where}: {name} must be a list of strings like "shell:ls*"')
        lists[name] = tuple(_rule(e, where, name) for e in entries)
    return Policy(mode="rules", **lists)


def _rule(entry: object, where: str, name: str) -> Rule:
    if not isinstance(entry, str):
        raise PolicyError(f"{where}: {name} entry {entry!r} must be a string KIND or KIND:GLOB")
    kind, _, glob = entry.partition(":")
    if kind not in KINDS:
        raise PolicyError(
            f"{where}: {name} entry {entry!r} has unknown kind {kind!r}; use one of "
            f"{', '.join(KINDS)}"
        )
    return Rule(kind, glob)


def _line_of(text: str, key: str) -> int:
    """The line where a top-level key is assigned (1 if it cannot be found)."""
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip().startswith(key) and "=" in line:
            return number
    return 1


def split_shell(command: str) -> list[str]:
    """The parts of a composite shell command (`a && b || c | d; e`), quotes respected."""
    parts: list[str] = []
    current: list[str] = []
    quote = ""
    i = 0
    while i < len(command):
        ch = command[i]
        if quote:
            current.append(ch)
            if ch == quote:
                quote = ""
            elif ch == "\\" and quote == '"' and i + 1 < len(command):
                current.append(command[i + 1])
                i += 1
        elif ch in "'\"":
            quote = ch
            current.append(ch)
        elif ch == "\\" and i + 1 < len(command):
            current.extend(command[i : i + 2])
            i += 1
        elif command[i : i + 2] in ("&&", "||") or ch in "|;\n":
            parts.append("".join(current).strip())
            current = []
            if command[i : i + 2] in ("&&", "||"):
                i += 1
        else:
            current.append(ch)
        i += 1
    parts.append("".join(current).strip())
    return [p for p in parts if p]
