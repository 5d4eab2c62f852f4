"""Every command a shell line runs, read with a real shell parser (bashlex, a port of bash's
own grammar), so that approval rules see each of them: the commands of `;`, `&&`, `||`,
`|`, `&` and newlines, of subshells and groups, of `$(...)`, backticks and `<(...)`, of
`sh -c`/`eval` strings and of `env`, `xargs`, `find -exec` and other runners
(actfleet/broker/shell_runners.py), and the files its redirections write.

Fail closed: a line the parser cannot read is one command that always asks; so is a
command whose name comes from an expansion or a glob, or that runs something this module
does not resolve (ANSI-C quoting, which sh and bash read differently; a here-document that
expands `$(...)`; `sudo`; ...). Nothing here raises on any input.

bashlex is imported on first use: importing it takes 0.15-0.4 s (it builds its parse
tables), and only workers read shell lines.
"""

from __future__ import annotations

import functools
import re
import threading
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from actfleet.broker.shell_runners import (
    SUBSCRIPT_BUILTINS,
    Argv,
    Unresolved,
    Word,
    inner_commands,
    runner_name,
)

MAX_DEPTH = 8
"""How deep `sh -c "sh -c '...'"` strings and runners are followed before asking."""

NOT_FILES = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr"})
"""Redirection targets that write no file."""

_WRITES = frozenset({">", ">>", ">|", "&>", "&>>", "<>"})
_READS_OR_DUPS = frozenset({"<", "<<<", "<&", "<<", "<<-"})


@dataclass(frozen=True)
class ShellCommand:
    """One command a line runs.

    `text`: as written, with its assignments, redirections and here-document: what a person
    approves and what allow rules match. `words`: its words after quote removal, without
    assignments and redirections (`'rm' -rf /` gives rm, -rf, /), matched by deny and ask
    rules too so that quoting cannot slip past them. `writes`: the files its redirections
    write, as written. `unresolved`: why it asks whatever the rules say ("" if fully read).
    """

    text: str
    words: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()
    unresolved: str = ""


_PARSING = threading.Lock()
"""bashlex parses with one module-level parser object: one parse at a time."""

_INPUT = Word("{}", "{}", dynamic=True)
_INPUT_SPAN = (-1, -1)


class _Unreadable(Exception):
    """A construct the walker does not know: the whole line asks."""


def shell_commands(line: str, depth: int = 0) -> list[ShellCommand]:
    """Every command `line` runs; [] when it runs none (blank, or only comments). A line
    that cannot be read is one unresolved command with the whole line as its text."""
    if _blank(line):
        return []  # which bashlex cannot parse
    if depth > MAX_DEPTH:
        return [ShellCommand(line.strip(), unresolved="shell code nested too deep")]
    try:
        with _PARSING:
            trees = _bashlex().parse(line)
        rest = line[max(_end(tree) for tree in trees) :]
        if not _blank(rest.lstrip(" \t;&")):
            raise _Unreadable(f"the parser stopped before {rest.strip()[:40]!r}")
        walker = _Walker(line, depth)
        for tree in trees:
            walker.visit(tree)
    except Exception as exc:  # bashlex raises ParsingError, NotImplementedError and others
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return [ShellCommand(line.strip(), unresolved=f"the shell parser cannot read it: {why}")]
    return walker.commands


def _blank(text: str) -> bool:
    """Whether shell text runs nothing: blank lines and comments only."""
    return all(not ln.strip() or ln.lstrip().startswith("#") for ln in text.splitlines())


def _end(node: Any) -> int:
    """Where a parsed tree ends in the line, here-document bodies included."""
    end = node.pos[1] if hasattr(node, "pos") else 0
    for value in vars(node).values():
        for child in value if isinstance(value, list) else [value]:
            if hasattr(child, "kind"):
                end = max(end, _end(child))
    return end


@functools.cache
def _bashlex() -> ModuleType:
    """bashlex, with here-documents whose delimiter is quoted (`<<'EOF'`) read as bash
    reads them: bashlex 0.18 looks for the delimiter with its quotes and fails."""
    import bashlex
    import bashlex.heredoc

    original = getattr(bashlex.heredoc, "makeheredoc", None)
    if original is not None and not getattr(original, "_actfleet", False):

        def makeheredoc(tokenizer: Any, redirnode: Any, lineno: int, killleading: bool) -> Any:
            word = redirnode.output.word
            redirnode.output.word = _unquote(word)
            try:
                return original(tokenizer, redirnode, lineno, killleading)
            finally:
                redirnode.output.word = word

        makeheredoc._actfleet = True  # type: ignore[attr-defined]
        bashlex.heredoc.makeheredoc = makeheredoc
    return bashlex


def _unquote(word: str) -> str:
    """Quote removal as for a here-document delimiter: `'EOF'`, `"EOF"`, `\\EOF` are EOF."""
    out: list[str] = []
    quote = ""
    i = 0
    while i < len(word):
        ch = word[i]
        if quote == "'":
            quote = "" if ch == "'" else quote
            out.append(ch if quote else "")
        elif ch == "\\" and i + 1 < len(word) and (not quote or word[i + 1] in '"\\$`'):
            out.append(word[i + 1])
            i += 1
        elif ch in "'\"" and (not quote or ch == quote):
            quote = "" if quote else ch
        else:
            out.append(ch)
        i += 1
    return "".join(out)


class _Walker:
    """Collects the commands of one parsed line (bashlex trees) into `commands`."""

    def __init__(self, line: str, depth: int) -> None:
        self.line = line
        self.depth = depth
        self.commands: list[ShellCommand] = []

    def source(self, node: Any) -> str:
        return self.line[node.pos[0] : node.pos[1]]

    def visit(self, node: Any) -> None:
        kind = node.kind
        if kind == "command":
            self.command(node)
        elif kind in ("list", "pipeline", "if", "while", "until"):
            for part in node.parts:
                self.visit(part)
        elif kind == "compound":
            self.compound(node)
        elif kind == "for":
            self.for_loop(node)
        elif kind == "function":
            for part in node.parts[1:]:  # the body; defining it runs nothing
                self.visit(part)
        elif kind in ("word", "assignment"):
            reasons = self.expansions(node)
            if reasons:
                raise _Unreadable(reasons[0])
        elif kind not in ("operator", "pipe", "reservedword"):
            raise _Unreadable(f"{kind} is not resolved")

    def compound(self, node: Any) -> None:
        """`( ... )`, `{ ...; }`, loops: their commands; and when their redirections write
        a file, one more command, the whole compound as written, carrying those writes."""
        for part in node.list:
            self.visit(part)
        redirects = getattr(node, "redirects", None) or []
        writes, reasons = self.redirections(redirects)
        if writes or reasons:
            self.commands.append(
                ShellCommand(self.source(node), writes=tuple(writes), unresolved="; ".join(reasons))
            )

    def for_loop(self, node: Any) -> None:
        """A for loop's header (`for f in *.txt`) is a command of its own: it sets a
        variable, as an assignment does. Then the commands of its body."""
        header: list[Any] = []
        for part in node.parts[1:]:
            if part.kind == "reservedword" and part.word in ("do", ";", "\n"):
                break
            header.append(part)
        words = [p for p in header if p.kind == "word"]
        end = header[-1].pos[1] if header else node.parts[0].pos[1]
        reasons = [r for w in words for r in self.expansions(w)]
        text = self.line[node.pos[0] : end]
        values = ("for", *(w.word for w in words[:1]), "in", *(w.word for w in words[1:]))
        self.commands.append(ShellCommand(text, values, unresolved="; ".join(reasons)))
        for part in node.parts[len(header) + 1 :]:
            self.visit(part)

    def command(self, node: Any) -> None:
        words: list[Any] = []
        redirects: list[Any] = []
        reasons: list[str] = []
        for part in node.parts:
            if part.kind == "redirect":
                redirects.append(part)
            elif part.kind in ("word", "assignment"):
                if part.kind == "word" or words:
                    words.append(part)
                reasons += self.expansions(part)
            else:
                raise _Unreadable(f"{part.kind} in a command is not resolved")
        writes, redirect_reasons = self.redirections(redirects)
        end = max([node.pos[1], *(r.heredoc.pos[1] for r in redirects if _heredoc(r))])
        self.simple(
            [self.word(w) for w in words],
            self.line[node.pos[0] : end],
            tuple(writes),
            reasons + redirect_reasons,
            [w.pos for w in words],
        )

    def simple(
        self,
        words: list[Word],
        text: str,
        writes: tuple[str, ...],
        reasons: list[str],
        spans: list[tuple[int, int]],
    ) -> None:
        """A command given its words: checks its name, records it, then follows what it runs."""
        reasons = reasons + _name_reasons(words)
        inner: list[Any] = []
        if not reasons:
            try:
                inner = inner_commands(words)
            except Unresolved as exc:
                reasons.append(str(exc))
        if self.depth > MAX_DEPTH:
            reasons.append("commands nested too deep")
            inner = []
        values = tuple(w.value for w in words)
        self.commands.append(ShellCommand(text, values, writes, "; ".join(reasons)))
        for run in inner:
            if isinstance(run, Argv):
                sub, sub_spans = words[run.start : run.end], spans[run.start : run.end]
                if run.appends_input:  # what xargs reads: unknown, so dynamic
                    sub, sub_spans = [*sub, _INPUT], [*sub_spans, _INPUT_SPAN]
                self.depth += 1
                try:
                    self.simple(sub, self.span_text(sub_spans), (), [], sub_spans)
                finally:
                    self.depth -= 1
            else:
                self.commands += shell_commands(run.code, self.depth + 1)

    def span_text(self, spans: list[tuple[int, int]]) -> str:
        """The source of consecutive words, ` {}` standing for words a runner appends."""
        real = [span for span in spans if span != _INPUT_SPAN]
        text = self.line[real[0][0] : real[-1][1]] if real else ""
        return f"{text} {_INPUT.value}" if spans[-1] == _INPUT_SPAN else text

    def word(self, node: Any) -> Word:
        source = self.source(node)
        return Word(node.word, source, _dynamic(node, source))

    def expansions(self, node: Any) -> list[str]:
        """Follows the commands run by the expansions inside a word; returns why the word
        cannot be resolved, if it cannot."""
        reasons: list[str] = []
        for part in getattr(node, "parts", None) or []:
            if part.kind in ("commandsubstitution", "processsubstitution"):
                code, reason = _substituted(self.source(part))
                if reason:
                    reasons.append(reason)
                else:  # bashlex keeps only the first command of a multi-line substitution
                    self.commands += shell_commands(code, self.depth + 1)
            elif part.kind == "parameter":
                value = getattr(part, "value", None)
                if not value:  # bashlex's reading of $'...' and $"..."
                    reasons.append(
                        "ANSI-C or locale quoting ($'...', $\"...\") is read differently by "
                        "sh and bash"
                    )
                elif any(ch in value for ch in "$`(["):
                    reasons.append(f"the parameter expansion ${{{value}}} is not resolved")
            elif part.kind != "tilde":
                reasons.append(f"{part.kind} in a word is not resolved")
        return reasons

    def redirections(self, redirects: list[Any]) -> tuple[list[str], list[str]]:
        """The files these redirections write, and why any of them cannot be resolved."""
        writes: list[str] = []
        reasons: list[str] = []
        for node in redirects:
            kind, target = node.type, node.output
            if not hasattr(target, "kind"):  # 2>&1, >&-: a file descriptor
                if kind not in (">&", "<&"):
                    reasons.append(f"redirection {kind} is not resolved")
                continue
            reasons += self.expansions(target)
            source = self.source(target)
            if _heredoc(node):
                quoted = any(ch in source for ch in "'\"\\")
                body = node.heredoc.value
                if not quoted and any(s in body for s in ("`", "$(", "${", "$[")):
                    reasons.append("a here-document whose body runs expansions")
                continue
            if kind == ">&" and (target.word == "-" or target.word.isdigit()):
                continue
            if kind in _WRITES or kind == ">&":
                if source.startswith((">(", "<(")) and source.endswith(")"):
                    continue  # a pipe to a command, which is followed above
                name = source if _dynamic(target, source) else target.word
                if name not in NOT_FILES:
                    writes.append(name)
            elif kind not in _READS_OR_DUPS:
                reasons.append(f"redirection {kind} is not resolved")
        return writes, reasons


def _substituted(source: str) -> tuple[str, str]:
    """The code of `$(...)`, `<(...)`, `>(...)` or backticks (unescaping backslash before
    backslash, backtick and dollar first), and why it cannot be read ("" if it can)."""
    if source[:2] in ("$(", "<(", ">(") and source.endswith(")"):
        return source[2:-1], ""
    if len(source) >= 2 and source[0] == source[-1] == "`":
        body = source[1:-1]
        if '\\"' in body:
            return "", "escaped quotes inside backticks are not resolved"
        return re.sub(r"\\([\\`$])", r"\1", body), ""
    return "", f"the substitution {source!r} is not resolved"


def _heredoc(redirect: Any) -> bool:
    return redirect.type in ("<<", "<<-") and getattr(redirect, "heredoc", None) is not None


def _dynamic(node: Any, source: str) -> bool:
    """Whether the shell expands this word to something not known from the text."""
    kinds = {p.kind for p in getattr(node, "parts", None) or []}
    return bool(kinds - {"tilde"}) or "$" in source or "`" in source


def _name_reasons(words: list[Word]) -> list[str]:
    """Why a command's name (or, for a few bash builtins, its arguments) cannot be known."""
    if not words:
        return []
    name = words[0]
    if name.dynamic:
        return [f"the command name {name.source} comes from an expansion"]
    value = name.value
    if any(ch in value for ch in "*?") or ("[" in value and "]" in value):
        return [f"the command name {name.source} is a glob pattern"]
    if "{" in value and "}" in value:
        return [f"the command name {name.source} may be a brace expansion"]
    if runner_name(value) in SUBSCRIPT_BUILTINS and any(
        "[" in w.value and ("$" in w.value or "`" in w.value) for w in words[1:]
    ):
        return [f"{value} evaluates expansions in an array subscript"]
    return []
