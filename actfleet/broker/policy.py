"""Approval policies: which actions run, which need a human, which are refused.

A policy is `auto`, `ask` or rules (TOML, up to three lists `deny`, `ask`, `allow`; entries
`KIND` or `KIND:GLOB`). `deny` is checked first, then `ask`, then `allow`; no match asks.
A shell line is decided command by command (actfleet/broker/shell_parse.py): every command
it runs must be allowed, and every file its redirections write must be allowed by a
`write:GLOB` rule. Pure code: the client checks a rules file at submission, the workers
apply it.
"""

from __future__ import annotations

import fnmatch
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

if TYPE_CHECKING:
    from actfleet.broker.shell_parse import ShellCommand

KINDS = ("code", "shell", "tool", "subagent")
RULE_KINDS = (*KINDS, "write")
"""`write:GLOB` rules match the files a shell command's redirections write (`> out`)."""
MODES = ("auto", "ask", "rules")
Verdict = Literal["allow", "ask", "deny"]

_DYNAMIC_PATH = frozenset("$`*?[{")


class PolicyError(ValueError):
    """A policy that cannot be used (the message names the file and the entry at fault)."""


class ShellVerdict(NamedTuple):
    """The verdict for one command of a shell line: `part` is the command as written (what
    a person approves), `rule` the rule(s) that gave the verdict ("" for none), `why` why
    it asks when no rule says so (a construct that is not resolved, a write no rule
    allows)."""

    part: str
    verdict: Verdict
    rule: str = ""
    why: str = ""


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
        `subject` is the shell line, the tool name, the code or the subagent prompt. A shell
        line is decided as a whole: denied if any of its commands is, allowed only if all
        are (see decide_shell)."""
        if self.mode == "auto":
            return "allow", ""
        if self.mode == "ask":
            return "ask", ""
        if kind == "shell" and subject.strip():
            verdicts = self.decide_shell(subject)
            for worst in ("deny", "ask"):
                for verdict in verdicts:
                    if verdict.verdict == worst:
                        return worst, verdict.rule  # type: ignore[return-value]
            if verdicts:
                return "allow", ", ".join(dict.fromkeys(v.rule for v in verdicts))
        for verdict, rules in (("deny", self.deny), ("ask", self.ask), ("allow", self.allow)):
            for rule in rules:
                if rule.matches(kind, subject):
                    return verdict, str(rule)  # type: ignore[return-value]
        return "ask", ""

    def decide_shell(self, line: str) -> list[ShellVerdict]:
        """Each command a shell line runs, with its verdict ([] when it runs none).

        For one command: a `shell:` deny rule matching it as written or as its words after
        quote removal (`'rm' -rf /` is `rm -rf /`, `/bin/rm` is also `rm`), or a `write:`
        deny rule matching a file it writes, denies. Otherwise a construct that is not
        resolved asks, whatever the rules say; so do `shell:`/`write:` ask rules (matched
        the same generous way). Otherwise it is allowed only if a `shell:` allow rule
        matches it exactly as written and a `write:` allow rule matches each file it writes
        (a name with an expansion, a glob or a `..` is never allowed); else it asks."""
        if self.mode == "auto":
            return [ShellVerdict(line.strip(), "allow")] if line.strip() else []
        commands = _shell_commands(line)
        if self.mode == "ask":
            return [ShellVerdict(c.text, "ask", "", c.unresolved) for c in commands]
        return [self._decide_command(c) for c in commands]

    def _decide_command(self, command: ShellCommand) -> ShellVerdict:
        text, forms, writes = command.text, _shell_forms(command), command.writes
        rule = _first(self.deny, "shell", forms) or _first(self.deny, "write", writes)
        if rule:
            return ShellVerdict(text, "deny", rule)
        if command.unresolved:
            return ShellVerdict(text, "ask", "", command.unresolved)
        rule = _first(self.ask, "shell", forms) or _first(self.ask, "write", writes)
        if rule:
            return ShellVerdict(text, "ask", rule)
        allowed = _first(self.allow, "shell", (text,))
        if not allowed:
            return ShellVerdict(text, "ask", "", "no rule allows it")
        rules = [allowed]
        for target in writes:
            if _DYNAMIC_PATH.intersection(target) or ".." in target.split("/"):
                return ShellVerdict(text, "ask", "", f"it writes {target}, not a plain file name")
            write_rule = _first(self.allow, "write", (target,))
            if not write_rule:
                return ShellVerdict(text, "ask", "", f"it writes {target}; no write rule allows it")
            rules.append(write_rule)
        return ShellVerdict(text, "allow", ", ".join(dict.fromkeys(rules)))

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
    if kind not in RULE_KINDS:
        raise PolicyError(
            f"{where}: {name} entry {entry!r} has unknown kind {kind!r}; use one of "
            f"{', '.join(RULE_KINDS)}"
        )
    return Rule(kind, glob)


def _first(rules: tuple[Rule, ...], kind: str, subjects: tuple[str, ...]) -> str:
    """The first rule of `kind` matching any of `subjects`, as written ("" for none)."""
    for rule in rules:
        if any(rule.matches(kind, subject) for subject in subjects):
            return str(rule)
    return ""


def _shell_forms(command: ShellCommand) -> tuple[str, ...]:
    """What deny and ask rules match a command on: as written, its words after quote
    removal (without assignments and redirections), and those with the command's
    directory dropped (`/bin/rm x` is also `rm x`)."""
    forms = [command.text]
    if command.words:
        forms.append(" ".join(command.words))
        name = command.words[0].rsplit("/", 1)[-1]
        forms.append(" ".join((name, *command.words[1:])))
    return tuple(dict.fromkeys(forms))


def _line_of(text: str, key: str) -> int:
    """The line where a top-level key is assigned (1 if it cannot be found)."""
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip().startswith(key) and "=" in line:
            return number
    return 1


def split_shell(command: str) -> list[str]:
    """Every command a shell line runs, as written (`ls $(rm x)` gives `rm x` and
    `ls $(rm x)`); a line that cannot be parsed is itself the one part."""
    return [c.text for c in _shell_commands(command)]


def _shell_commands(line: str) -> list[ShellCommand]:
    """shell_parse.shell_commands, imported on first use: the client imports this module to
    read rules files and never reads a shell line (the parser costs ~15 ms to import, and
    bashlex ~0.15 s more on first parse)."""
    from actfleet.broker.shell_parse import shell_commands

    return shell_commands(line)
