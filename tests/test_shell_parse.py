"""Reading a shell line into every command it runs (bashlex), and the runners followed."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actfleet.broker.policy import Policy, Rule
from actfleet.broker.shell_parse import ShellCommand, shell_commands


def texts(line: str) -> list[str]:
    return [c.text for c in shell_commands(line)]


def unresolved(line: str) -> list[str]:
    return [c.unresolved for c in shell_commands(line) if c.unresolved]


def test_every_separator_and_substitution_gives_its_commands():
    assert texts("a; b & c && d || e | f |& g\nh") == list("abcdefgh")
    assert texts("ls $(rm x) `cat y` <(wc z)") == [
        "rm x",
        "cat y",
        "wc z",
        "ls $(rm x) `cat y` <(wc z)",
    ]
    assert texts("(a; b) && { c; } && if d; then e; fi") == list("abcde")
    assert texts("ls 'a;b' \"c && d\" e\\;f") == ["ls 'a;b' \"c && d\" e\\;f"]


def test_substitutions_are_read_whole_or_ask():
    # bashlex keeps only the first line of a substitution, and cannot read && inside one
    assert texts("ls `ls\n r\\m x`")[:2] == ["ls", "r\\m x"]
    assert "not resolved" in unresolved("ls $(ls\nrm x)")[0]
    assert "cannot read" in unresolved("echo $(cd x && pwd)")[0]


def test_words_are_the_command_after_quote_removal_without_assignments_or_redirections():
    (command,) = shell_commands("X=1 'rm' -r\"f\" \\x 2>/dev/null")
    assert command.words == ("rm", "-rf", "x")
    assert command.text == "X=1 'rm' -r\"f\" \\x 2>/dev/null"


def test_shell_strings_and_eval_are_read_in_turn():
    assert texts("bash -lc 'ls && rm x'") == ["bash -lc 'ls && rm x'", "ls", "rm x"]
    assert texts('sh -e -o pipefail -c "ls | wc" name arg')[1:] == ["ls", "wc"]
    assert texts("eval 'ls; rm x'")[1:] == ["ls", "rm x"]
    assert texts("sh -c \"sh -c 'rm x'\"") == ["sh -c \"sh -c 'rm x'\"", "sh -c 'rm x'", "rm x"]


def test_runners_give_the_command_they_run():
    assert texts("env -i X=1 sh -c 'rm x'") == [
        "env -i X=1 sh -c 'rm x'",
        "sh -c 'rm x'",
        "rm x",
    ]
    assert texts("timeout -s KILL 5 nice -n 3 rm x")[1:] == ["nice -n 3 rm x", "rm x"]
    assert texts("find . -name '*.py' -exec grep -l foo {} + -execdir rm {} \\;")[1:] == [
        "grep -l foo {}",
        "rm {}",
    ]
    assert texts("ls | xargs -0 -n1 rm -f")[2:] == ["rm -f {}"]  # {}: words read from input
    assert texts("ls | xargs -I{} mv {} {}.bak")[2:] == ["mv {} {}.bak"]


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("$X", "comes from an expansion"),
        ("$(echo rm) x", "comes from an expansion"),
        ("r* x", "glob pattern"),
        ("{rm,x}", "brace expansion"),
        ('sh -c "$CMD"', "comes from an expansion"),
        ("bash script.sh", "without -c"),
        ("ls | sh", "without -c"),
        ("sudo ls", "does not resolve"),
        ("source env.sh", "runs the commands of a file"),
        ("env -S 'rm x' ls", "not one actfleet reads"),
        ("env X=1 Y=$Z ls", "an assignment of env comes from an expansion"),
        ("xargs --frobnicate rm", "not one actfleet reads"),
        ("find . $EXPR", "comes from an expansion"),
        ("find . -exec rm {}", "without its terminating"),
        ("xargs sh -c", "comes from an expansion"),
        ("echo $'a\\' ; rm x ; '", "ANSI-C"),
        ("echo ${X:-$(rm x)}", "parameter expansion"),
        ("cat <<EOF\n$(rm x)\nEOF", "here-document"),
        ("[ -v 'a[$(rm x)]' ]", "array subscript"),
        ("echo $((1 + 2))", "cannot read"),
        ("case x in x) rm x;; esac", "cannot read"),
        ("ls 'unterminated", "cannot read"),
    ],
)
def test_constructs_that_are_not_resolved_are_marked_so(line: str, why: str):
    reasons = unresolved(line)
    assert reasons and why in reasons[0], (line, reasons)


def test_a_line_that_cannot_be_read_is_one_command_the_whole_line():
    (command,) = shell_commands("  ls; rm x $(  ")
    assert command.text == "ls; rm x $(" and command.words == () == command.writes
    assert command.unresolved.startswith("the shell parser cannot read it: unexpected EOF")


def test_write_redirections_are_recorded_and_others_are_not():
    writes = {line: shell_commands(line)[-1].writes for line in (
        "ls > a", "ls >> a", "ls >| a", "ls &> a", "ls &>> a", "ls <> a", "ls 2> a", "ls >&a",
        "ls > \"$F\"", "ls 2>&1", "ls >&2", "ls 2>&-", "ls >/dev/null", "ls < a", "ls > >(wc)",
        "{ ls; } > a",
    )}  # fmt: skip
    assert writes == {
        **dict.fromkeys(("ls > a", "ls >> a", "ls >| a", "ls &> a", "ls &>> a"), ("a",)),
        **dict.fromkeys(("ls <> a", "ls 2> a", "ls >&a", "{ ls; } > a"), ("a",)),
        'ls > "$F"': ('"$F"',),
        **dict.fromkeys(("ls 2>&1", "ls >&2", "ls 2>&-", "ls >/dev/null", "ls < a"), ()),
        "ls > >(wc)": (),
    }


def test_here_documents_are_part_of_their_command_with_quoted_delimiters_read_as_bash_does():
    (command,) = shell_commands("cat <<'EOF' > f.py\nprint('$(not run)')\nEOF\n")
    assert command.text == "cat <<'EOF' > f.py\nprint('$(not run)')\nEOF"
    assert command.writes == ("f.py",) and not command.unresolved
    assert texts('cat <<"END"\nx\nEND\nls') == ['cat <<"END"\nx\nEND', "ls"]


def test_a_for_loop_header_is_a_command_since_it_sets_a_variable():
    assert texts('for f in *.txt; do wc -l "$f"; done') == ["for f in *.txt", 'wc -l "$f"']


def test_blank_and_comment_only_lines_run_nothing():
    assert shell_commands("") == shell_commands("  \n") == shell_commands("# a\n  # b") == []
    assert texts("# a\nls # b; rm x\n# c") == ["ls"]


# Property tests. Arbitrary text: the reader never raises, it returns commands.

SHELLISH = st.text(alphabet="lsrmx -;&|$()`'\"\\<>{}\n#*=", max_size=40)


@settings(max_examples=300, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.text(max_size=60), SHELLISH))
def test_reading_any_text_never_raises_and_gives_commands_or_asks(line: str):
    commands = shell_commands(line)
    assert all(isinstance(c, ShellCommand) and isinstance(c.text, str) for c in commands)
    if line.strip() and not commands:
        assert all(not ln.strip() or ln.lstrip().startswith("#") for ln in line.splitlines())
    policy = Policy(mode="rules", allow=(Rule("shell", "ls*"),))
    assert policy.decide("shell", line)[0] in ("allow", "ask")


# Against real shells: a line an `ls*` rule allows never runs `rm`, in bash or in sh.

LEAVES = [
    *("ls", "ls -l", "rm x", "'rm' x", "r\\m x", "ls 'a;rm x'", 'ls "a;rm x"', "ls \\; rm x"),
    *("ls # ; rm x", "ls ${X:-;rm x}", "ls <<E\nrm x\nE\n", "ls $'a\\' ; rm x ; '"),
]


def _compose(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    pair = st.tuples(inner, st.sampled_from([";", "&&", "||", "|", "&", "\n"]), inner)
    return st.one_of(
        pair.map(lambda t: f"{t[0]} {t[1]} {t[2]}"),
        inner.map(lambda s: f"ls $({s})"),
        inner.filter(lambda s: "`" not in s).map(lambda s: f"ls `{s}`"),
        inner.map(lambda s: f"ls <({s})"),
        inner.map(lambda s: f"( {s} )"),
        inner.map(lambda s: f"{{ {s}; }}"),
        inner.filter(lambda s: "'" not in s).map(lambda s: f"sh -c '{s}'"),
        inner.filter(lambda s: "'" not in s).map(lambda s: f"eval '{s}'"),
    )


LINES = st.one_of(st.recursive(st.sampled_from(LEAVES), _compose, max_leaves=4), SHELLISH)


@pytest.fixture(scope="module")
def fake_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A PATH with only a harmless `ls` and an `rm` that leaves a mark, and `sh` for sh -c."""
    root = tmp_path_factory.mktemp("fakebin")
    for name, body in (("ls", "exit 0"), ("rm", f"echo ran >> {root}/rm-ran")):
        (root / name).write_text(f"#!/bin/sh\n{body}\n")
        (root / name).chmod(0o755)
    (root / "sh").symlink_to(shutil.which("sh") or "/bin/sh")
    return root


def runs_rm(fake_bin: Path, shell: str, line: str) -> bool:
    """Whether `shell -c line` ran `rm` (waiting for background commands too)."""
    mark = fake_bin / "rm-ran"
    mark.unlink(missing_ok=True)
    read, write = os.pipe()  # held by every process the line starts, background ones too
    try:
        subprocess.run(
            [shutil.which(shell) or shell, "-c", line],
            env={"PATH": str(fake_bin)},
            cwd=fake_bin,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            pass_fds=(write,),
            timeout=10,
        )
        os.close(write)
        write = -1
        os.read(read, 1)  # EOF once the last of them has exited
    finally:
        os.close(read)
        if write >= 0:
            os.close(write)
    return mark.exists()


@pytest.mark.parametrize("shell", ["bash", "sh"])
def test_the_real_shell_harness_sees_rm_run_in_the_background(fake_bin: Path, shell: str):
    assert runs_rm(fake_bin, shell, "ls & (sh -c 'rm x' &)")
    assert not runs_rm(fake_bin, shell, "ls 'a;rm x'")


@pytest.mark.parametrize("shell", ["bash", "sh"])
@settings(max_examples=250, derandomize=True, deadline=None)
@given(line=LINES)
def test_a_line_an_ls_rule_allows_never_runs_rm_in_a_real_shell(
    fake_bin: Path, shell: str, line: str
):
    policy = Policy(mode="rules", allow=(Rule("shell", "ls*"),))
    if policy.decide("shell", line)[0] == "allow":
        assert not runs_rm(fake_bin, shell, line), f"{shell} ran rm for an allowed line: {line!r}"
