"""Approval policies: auto, ask, rules (deny, then ask, then allow; no match asks)."""

from __future__ import annotations

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
