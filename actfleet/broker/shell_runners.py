"""Commands that run other commands (`sh -c`, `env`, `xargs`, `find -exec`, `nice`, ...):
which of their words are the command they run, so that it is matched against the rules
too. A rule that allows `find *` must not allow `find . -exec rm {} ;`.

Pure code on the words of one command, after quote removal. A runner whose options cannot
be read, whose command comes from an expansion, or that is known to run commands in a way
not resolved here (`sudo`, `source`, a shell reading a script file) is Unresolved: its
command asks, whatever the rules say.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass


def _names(text: str) -> frozenset[str]:
    """A set of names written as one string, space-separated."""
    return frozenset(text.split())


SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "yash", "posh"})
"""Shells whose `-c STRING` is parsed as shell code in turn."""

UNRESOLVED_RUNNERS = {
    ".": "runs the commands of a file",
    "source": "runs the commands of a file",
    **{
        name: "runs another command in a way actfleet does not resolve"
        for name in _names(
            "sudo doas su runuser sg chroot unshare nsenter flock watch parallel strace ltrace "
            "ionice chrt taskset prlimit setpriv systemd-run script fakeroot firejail bwrap "
            "proot xvfb-run"
        )
    },
}
"""Known to run other commands; not resolved, so they always ask."""

SUBSCRIPT_BUILTINS = _names(
    "test [ printf read declare typeset local export readonly unset let mapfile readarray "
    "wait getopts"
)
"""bash builtins that take variable names and evaluate `$(...)` in their array subscripts."""

_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


class Unresolved(Exception):
    """The command runs something that cannot be read from its words; the message says why."""


@dataclass(frozen=True)
class Word:
    """One word of a command: `value` after quote removal, `source` as written, `dynamic`
    when the shell expands it (a variable, `$(...)`, backticks), so its value is unknown."""

    value: str
    source: str = ""
    dynamic: bool = False


@dataclass(frozen=True)
class Argv:
    """Words `start:end` of the runner are a command it runs. `appends_input`: the runner
    adds words read from its input (`xargs rm`), shown as ` {}` after the command."""

    start: int
    end: int
    appends_input: bool = False


@dataclass(frozen=True)
class Script:
    """A string the runner runs as shell code (`sh -c STRING`, `eval WORDS`)."""

    code: str


Inner = Argv | Script


@dataclass(frozen=True)
class _Options:
    """A runner's command-line syntax: options without a value, options with one (as the
    next word, or attached: `-n5`, `--adjustment=5`), and words before the command."""

    flags: frozenset[str] = frozenset()
    valued: frozenset[str] = frozenset()
    positionals: int = 0
    numeric_flags: bool = False  # `nice -10`


_PREFIX_RUNNERS: dict[str, _Options] = {
    "nice": _Options(valued=frozenset({"-n", "--adjustment"}), numeric_flags=True),
    "nohup": _Options(),
    "timeout": _Options(
        flags=frozenset({"--preserve-status", "--foreground", "-v", "--verbose"}),
        valued=frozenset({"-s", "--signal", "-k", "--kill-after"}),
        positionals=1,
    ),
    "stdbuf": _Options(valued=frozenset({"-i", "-o", "-e", "--input", "--output", "--error"})),
    "setsid": _Options(flags=frozenset({"-c", "-f", "-w", "--ctty", "--fork", "--wait"})),
    "command": _Options(flags=frozenset({"-p", "-v", "-V"})),
    "builtin": _Options(),
    "exec": _Options(flags=frozenset({"-c", "-l"}), valued=frozenset({"-a"})),
    "time": _Options(
        flags=frozenset({"-p", "--portability", "-v", "--verbose", "-q", "--quiet"}),
        valued=frozenset({"-f", "--format"}),
    ),
    "busybox": _Options(),
}
"""Runners whose command is every word after their options (and positionals)."""


def runner_name(word: str) -> str:
    """The name a command word is looked up by: `/usr/bin/env` is `env`."""
    return word.rsplit("/", 1)[-1]


def inner_commands(words: Sequence[Word]) -> list[Inner]:
    """What the command `words` (name first) runs besides itself: [] for a command that is
    not a runner. Raises Unresolved when that cannot be known from the words."""
    if not words:
        return []
    name = runner_name(words[0].value)
    if name in UNRESOLVED_RUNNERS:
        raise Unresolved(f"{name} {UNRESOLVED_RUNNERS[name]}")
    if name in SHELLS:
        return _shell(words)
    if name == "eval":
        return _eval(words)
    if name == "env":
        return _env(words)
    if name == "xargs":
        return _xargs(words)
    if name == "find":
        return _find(words)
    if name in _PREFIX_RUNNERS:
        start = _skip_options(words, _PREFIX_RUNNERS[name])
        return [Argv(start, len(words))] if start < len(words) else []
    return []


def _static(word: Word, what: str) -> str:
    if word.dynamic:
        raise Unresolved(f"{what} comes from an expansion ({word.source or word.value})")
    return word.value


def _skip_options(words: Sequence[Word], options: _Options) -> int:
    """The index of the first word after the options and positionals of a prefix runner."""
    name, i = runner_name(words[0].value), 1
    while i < len(words):
        word = _static(words[i], f"an option of {name}")
        if word == "--":
            i += 1
            break
        if not word.startswith("-") or word == "-":
            break
        option, _, attached = word.partition("=") if word.startswith("--") else (word, "", "")
        if option in options.flags and not attached:
            i += 1
        elif option in options.valued:
            i += 1 if attached else 2
        elif not word.startswith("--") and word[:2] in options.valued:
            i += 1  # -n5
        elif options.numeric_flags and word[1:].isdigit():
            i += 1
        else:
            raise Unresolved(f"{name}: option {word!r} is not one actfleet reads")
    for _ in range(options.positionals):
        if i < len(words):
            _static(words[i], f"an argument of {name}")
            i += 1
    return i


_SHELL_LONG_FLAGS = frozenset(
    {"--login", "--noprofile", "--norc", "--posix", "--restricted", "--verbose", "--noediting"}
)


def _shell(words: Sequence[Word]) -> list[Inner]:
    """`bash -lc STRING [NAME ARGS...]`: STRING is parsed in turn. A shell without `-c`
    runs a script file or reads commands from its input: unresolved."""
    name, i, command_string = runner_name(words[0].value), 1, False
    while i < len(words):
        if command_string and words[i].dynamic:
            break  # the command string, refused below
        word = _static(words[i], f"an option of {name}")
        if word in ("--", "-"):
            i += 1
            break
        if word in _SHELL_LONG_FLAGS:
            i += 1
        elif word in ("--rcfile", "--init-file"):
            i += 2
        elif len(word) > 1 and word[0] in "-+" and word[1:].isalpha():
            command_string = command_string or "c" in word[1:]
            i += 1 + sum(word[1:].count(letter) for letter in "oO")  # -o pipefail
        elif word.startswith(("-", "+")):
            raise Unresolved(f"{name}: option {word!r} is not one actfleet reads")
        else:
            break
    if not command_string:
        raise Unresolved(f"{name} without -c runs a script file or reads commands from its input")
    if i >= len(words):
        raise Unresolved(f"{name} -c without a command string")
    return [Script(_static(words[i], f"the command string of {name} -c"))]


def _eval(words: Sequence[Word]) -> list[Inner]:
    code = " ".join(_static(w, "the code of eval") for w in words[1:])
    return [Script(code)] if code.strip() else []


def _env(words: Sequence[Word]) -> list[Inner]:
    """`env [-i] [-u NAME] [-C DIR] [NAME=VALUE...] [COMMAND...]`; `-S` is unresolved."""
    i = _skip_options(
        words,
        _Options(
            flags=frozenset({"-i", "--ignore-environment", "-0", "--null", "-v", "--debug"}),
            valued=frozenset({"-u", "--unset", "-C", "--chdir"}),
        ),
    )
    if i < len(words) and words[i].value == "-":  # `env -` is `env -i`
        i += 1
    while i < len(words) and _ASSIGNMENT.match(words[i].value):
        _static(words[i], "an assignment of env")  # `Y=$Z` could split into a command
        i += 1
    if i < len(words):
        _static(words[i], "the command env runs")
        return [Argv(i, len(words))]
    return []


_XARGS_FLAGS = _names(
    "-0 -r -t -p -x -o --null --no-run-if-empty --verbose --interactive --exit --open-tty"
)
_XARGS_VALUED = _names(
    "-a -d -E -I -L -n -P -s --arg-file --delimiter --max-args --max-procs --max-chars "
    "--process-slot-var"
)
_XARGS_OPTIONAL = _names("-e -i -l --eof --replace --max-lines")
"""Options whose value, if any, is attached (`-i{}`, `--replace={}`)."""


def _xargs(words: Sequence[Word]) -> list[Inner]:
    """`xargs [options] [COMMAND [ARGS...]]`: COMMAND runs with words read from its input
    appended (or put in place of the `-I` string). No COMMAND runs `echo`."""
    i, replaces = 1, False
    while i < len(words):
        word = _static(words[i], "an option of xargs")
        if word == "--":
            i += 1
            break
        if not word.startswith("-") or word == "-":
            break
        if word.startswith("--"):
            option, eq, _ = word.partition("=")
            if option in _XARGS_FLAGS and not eq or option in _XARGS_OPTIONAL:
                i += 1
            elif option in _XARGS_VALUED:
                i += 1 if eq else 2
            else:
                raise Unresolved(f"xargs: option {word!r} is not one actfleet reads")
            replaces = replaces or option == "--replace"
            continue
        taken, replacing = _xargs_short_cluster(word)
        i += taken
        replaces = replaces or replacing
    if i >= len(words):
        return []
    _static(words[i], "the command xargs runs")
    return [Argv(i, len(words), appends_input=not replaces)]


def _xargs_short_cluster(word: str) -> tuple[int, bool]:
    """How many words a cluster of short xargs options (`-0rn1`, `-I {}`) takes (1 or 2),
    and whether it sets a replace string (`-I`, `-i`)."""
    for position in range(1, len(word)):
        option = "-" + word[position]
        rest = word[position + 1 :]
        if option in _XARGS_FLAGS:
            continue
        replacing = option in ("-I", "-i")
        if option in _XARGS_OPTIONAL:
            return 1, replacing
        if option in _XARGS_VALUED:
            return (1 if rest else 2), replacing
        raise Unresolved(f"xargs: option {word!r} is not one actfleet reads")
    return 1, False


_FIND_EXEC = frozenset({"-exec", "-execdir", "-ok", "-okdir"})


def _find(words: Sequence[Word]) -> list[Inner]:
    """Each `-exec COMMAND ... ;` (or `{} +`, and -execdir, -ok, -okdir) of a find. Any
    expansion in a find makes it unresolved: it could expand to `-exec ...`."""
    inner: list[Inner] = []
    values = [_static(w, "a word of find") for w in words]
    i = 1
    while i < len(values):
        if values[i] not in _FIND_EXEC:
            i += 1
            continue
        start, end = i + 1, i + 1
        while end < len(values) and not (
            values[end] == ";" or (values[end] == "+" and values[end - 1] == "{}")
        ):
            end += 1
        if end >= len(values):
            raise Unresolved(f"find {values[i]} without its terminating ';' or '+'")
        if end <= start:
            raise Unresolved(f"find {values[i]} without a command")
        inner.append(Argv(start, end))  # `{} +` runs the command with `{}` standing for many
        i = end + 1
    return inner
