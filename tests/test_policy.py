"""Approval policies: auto, ask, rules (deny, then ask, then allow; no match asks)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from actfleet.broker.approvals import args_sha256
from actfleet.broker.policy import Policy, PolicyError, load_policy, split_shell


def rules(tmp_path: Path, text: str) -> Policy:
    path = tmp_path / "rules.toml"
    path.write_text(text)
    return load_policy(str(path))


def test_auto_allows_and_ask_asks_every_kind():
    for kind in ("code", "shell", "tool", "subagent"):
        assert load_policy("auto").decide(kind, "x")[0] == "allow"
        assert load_policy("ask").decide(kind, "x")[0] == "ask"


def test_deny_is_checked_before_ask_and_ask_before_allow(tmp_path: Path):
    policy = rules(
        tmp_path,
        'deny = ["shell:rm *"]\nask = ["shell:pip install *"]\n'
        'allow = ["code", "shell:*", "tool:time_*"]\n',
    )
    assert policy.decide("shell", "rm -rf /") == ("deny", "shell:rm *")
    assert policy.decide("shell", "pip install requests") == ("ask", "shell:pip install *")
    assert policy.decide("shell", "ls -la") == ("allow", "shell:*")
    assert policy.decide("code", "print(1)") == ("allow", "code")
    assert policy.decide("tool", "time_now") == ("allow", "tool:time_*")


def test_no_matching_rule_asks(tmp_path: Path):
    policy = rules(tmp_path, 'allow = ["shell:ls*"]\n')
    assert policy.decide("tool", "weather") == ("ask", "")
    assert policy.decide("subagent", "do it") == ("ask", "")


def test_composite_shell_commands_split_into_parts_respecting_quotes():
    assert split_shell('ls -la && echo "a && b" | grep a; rm x || true') == [
        "ls -la",
        'echo "a && b"',
        "grep a",
        "rm x",
        "true",
    ]
    assert split_shell("echo 'x|y'") == ["echo 'x|y'"]


def test_malformed_rules_file_is_refused_with_the_line_at_fault(tmp_path: Path):
    with pytest.raises(PolicyError, match=r"rules.toml:2: allow entry 'files:\*' has unknown"):
        rules(tmp_path, 'deny = ["shell:rm *"]\nallow = ["files:*"]\n')
    with pytest.raises(PolicyError, match=r"rules.toml:1: unknown key 'permit'"):
        rules(tmp_path, 'permit = ["code"]\n')
    with pytest.raises(PolicyError, match="fix the TOML syntax"):
        rules(tmp_path, "allow = [\n")
    with pytest.raises(PolicyError, match="not auto, ask, or a rules file"):
        load_policy("sometimes")


def test_policy_round_trips_through_its_data_form(tmp_path: Path):
    policy = rules(tmp_path, 'deny = ["shell:rm *"]\nallow = ["code"]\n')
    assert Policy.from_data(policy.to_data()) == policy


def test_args_hash_is_canonical_and_covers_the_tool():
    assert args_sha256("t", {"a": 1, "b": [2]}) == args_sha256("t", {"b": [2], "a": 1})
    assert args_sha256("t", {"a": 1}) != args_sha256("u", {"a": 1})
    assert args_sha256("t", {"a": 1}) != args_sha256("t", {"a": 2})


LS_ONLY = 'allow = ["shell:ls*"]\n'


@pytest.mark.parametrize(
    "line",
    [
        "ls; rm x",
        "ls & rm x",
        "ls && rm x",
        "ls || rm x",
        "ls | sh",
        "ls $(rm x)",
        "ls `rm x`",
        "ls <(rm x)",
        "ls > >(rm x)",
        "ls\nrm x",
        "(ls; rm x)",
        "{ ls; rm x; }",
        "if ls; then rm x; fi",
        "ls() { rm x; }; ls",
        "bash -c 'rm x'",
        "ls > ~/.bashrc",
        'ls "$(rm x)"',
        "ls $(ls $(rm x))",
        "ls `ls; rm x`",
        "ls; ls 'unterminated",
    ],
)
def test_no_line_that_runs_more_than_ls_is_allowed_by_an_ls_rule(tmp_path: Path, line: str):
    policy = rules(tmp_path, LS_ONLY)
    assert policy.decide("shell", line)[0] == "ask"
    assert "ask" in {v.verdict for v in policy.decide_shell(line)}


@pytest.mark.parametrize("line", ["ls -la", "ls | ls", "ls 'a;b'", "ls && ls -l", "ls 2>&1"])
def test_lines_of_allowed_commands_only_are_still_allowed(tmp_path: Path, line: str):
    assert rules(tmp_path, LS_ONLY).decide("shell", line) == ("allow", "shell:ls*")


def test_command_substitution_inside_allowed_command_asks_for_what_it_runs(tmp_path: Path):
    policy = rules(tmp_path, LS_ONLY)
    assert [tuple(v[:3]) for v in policy.decide_shell("ls $(rm x)")] == [
        ("rm x", "ask", ""),
        ("ls $(rm x)", "allow", "shell:ls*"),
    ]


def test_a_denied_command_anywhere_in_the_line_denies_it(tmp_path: Path):
    policy = rules(tmp_path, 'deny = ["shell:rm *"]\nallow = ["shell:*"]\n')
    for line in ("ls $(rm -rf x)", "bash -lc 'ls && rm -rf x'", "env X=1 sh -c 'rm x'"):
        assert policy.decide("shell", line) == ("deny", "shell:rm *"), line
    assert policy.decide("shell", "find . -name '*.py' -exec rm {} +") == ("deny", "shell:rm *")
    assert policy.decide("shell", "ls | xargs rm") == ("deny", "shell:rm *")


def test_deny_rules_see_through_quoting_paths_and_assignments(tmp_path: Path):
    policy = rules(tmp_path, 'deny = ["shell:rm *"]\nallow = ["shell:*"]\n')
    for line in ("'rm' -rf x", "r''m -rf x", "\\rm -rf x", "/bin/rm -rf x", "X=1 rm -rf x"):
        assert policy.decide("shell", line)[0] == "deny", line


def test_allow_rules_match_a_command_only_as_written(tmp_path: Path):
    policy = rules(tmp_path, 'allow = ["shell:ls*"]\n')
    assert policy.decide("shell", "PATH=/tmp/evil ls")[0] == "ask"
    assert policy.decide("shell", "'ls' -la")[0] == "ask"


def test_a_runner_allowed_by_a_rule_does_not_allow_what_it_runs(tmp_path: Path):
    policy = rules(tmp_path, 'allow = ["shell:find *", "shell:xargs *", "shell:env *"]\n')
    assert policy.decide("shell", "find . -name x")[0] == "allow"
    assert policy.decide("shell", "find . -exec rm {} ;")[0] == "ask"
    assert policy.decide("shell", "ls | xargs rm")[0] == "ask"
    assert policy.decide("shell", "env X=1 rm x")[0] == "ask"


def test_variables_and_globs_in_command_position_ask_even_under_a_blanket_allow(tmp_path: Path):
    policy = rules(tmp_path, 'allow = ["shell"]\n')
    assert policy.decide("shell", "ls -la") == ("allow", "shell")
    for line in ("$X", "$X -rf x", "$(echo rm) x", "`echo rm` x", "*", "/bin/r? x", "{rm,x}"):
        assert policy.decide("shell", line) == ("ask", ""), line
    verdict = policy.decide_shell("$X")[0]
    assert "comes from an expansion" in verdict.why


def test_a_line_the_parser_cannot_read_asks_and_deny_rules_still_apply(tmp_path: Path):
    policy = rules(tmp_path, 'deny = ["shell:rm *"]\nallow = ["shell:*"]\n')
    unreadable = policy.decide_shell("ls 'unterminated")
    assert [(v.part, v.verdict) for v in unreadable] == [("ls 'unterminated", "ask")]
    assert "cannot read" in unreadable[0].why
    assert policy.decide("shell", "rm -rf / $(")[0] == "deny"
    assert policy.decide("shell", "echo $((1 + 2))")[0] == "ask"  # not resolved by bashlex


def test_write_redirection_asks_unless_a_write_rule_allows_its_target(tmp_path: Path):
    policy = rules(tmp_path, 'allow = ["shell:ls*", "write:/tmp/*", "write:out.txt"]\n')
    for line in ("ls > ~/.bashrc", "ls >> notes", "ls &> log", "ls >| f", "ls 2> err", "ls >&f"):
        verdict = policy.decide_shell(line)[0]
        assert verdict.verdict == "ask" and "no write rule allows it" in verdict.why, line
    assert policy.decide("shell", "ls > /tmp/listing") == ("allow", "shell:ls*, write:/tmp/*")
    assert policy.decide("shell", "ls >> out.txt")[0] == "allow"
    for line in ("ls > /tmp/../home/x", "ls > /tmp/$F", "ls > /tmp/*.txt"):
        assert "not a plain file name" in policy.decide_shell(line)[0].why, line


def test_redirections_that_write_no_file_need_no_write_rule(tmp_path: Path):
    policy = rules(tmp_path, LS_ONLY)
    for line in ("ls 2>&1", "ls >/dev/null 2>&1", "ls 2>/dev/null", "ls < input", "ls >&2"):
        assert policy.decide("shell", line)[0] == "allow", line


def test_write_deny_and_ask_rules_apply_to_any_command(tmp_path: Path):
    policy = rules(tmp_path, 'deny = ["write:/etc/*"]\nask = ["write:*.py"]\nallow = ["shell"]\n')
    assert policy.decide("shell", "echo x > /etc/passwd") == ("deny", "write:/etc/*")
    assert policy.decide("shell", "echo x > a.py") == ("ask", "write:*.py")
    assert policy.decide("shell", "{ echo x; } > /etc/hosts") == ("deny", "write:/etc/*")


def test_a_denied_part_is_reported_with_every_part_decided(tmp_path: Path):
    policy = rules(tmp_path, 'deny = ["shell:rm *"]\nallow = ["shell:ls*"]\n')
    assert [(v.part, v.verdict, v.rule) for v in policy.decide_shell("ls && rm x | wc")] == [
        ("ls", "allow", "shell:ls*"),
        ("rm x", "deny", "shell:rm *"),
        ("wc", "ask", ""),
    ]


def test_auto_and_ask_modes_decide_shell_lines_without_rules():
    assert load_policy("auto").decide_shell("ls; rm x") == [("ls; rm x", "allow", "", "")]
    asked = load_policy("ask").decide_shell("ls $(rm x)")
    assert [(v.part, v.verdict) for v in asked] == [("rm x", "ask"), ("ls $(rm x)", "ask")]
    assert load_policy("ask").decide_shell("  ") == []


def test_write_rules_are_valid_entries_of_a_rules_file(tmp_path: Path):
    policy = rules(tmp_path, 'allow = ["shell:ls*", "write:/tmp/*"]\n')
    assert Policy.from_data(policy.to_data()) == policy
    with pytest.raises(PolicyError, match="use one of code, shell, tool, subagent, write"):
        rules(tmp_path, 'allow = ["writes:/tmp/*"]\n')


def test_the_client_reads_a_rules_file_without_importing_the_shell_parser(tmp_path: Path):
    path = tmp_path / "rules.toml"
    path.write_text('allow = ["shell:ls*", "write:/tmp/*"]\n')
    code = (
        "import sys, actfleet.client\n"
        "from actfleet.broker.policy import load_policy\n"
        f"load_policy({str(path)!r}).decide('tool', 'x')\n"
        "assert not {'bashlex', 'actfleet.broker.shell_parse'} & set(sys.modules)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=30)
