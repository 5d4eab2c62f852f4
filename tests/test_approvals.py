"""Approvals through the reply channel: parked turns that hold no worker, decisions bound
to the exact arguments, first decision wins, expiry, and decisions that are never lost."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pexpect
import pytest

from actfleet.broker import events as ev
from actfleet.client import Client, DecisionRefused
from tests.conftest import cli, write_replay


def first(client: Client, session_id: str, cls: type, after: str | None = None) -> ev.Event:
    """The first event of a type in the session (waits for it)."""
    for event in client.events(session_id, after):
        if isinstance(event, cls):
            return event
    raise AssertionError("stream ended")


def rules_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "rules.toml"
    path.write_text(text)
    return str(path)


@pytest.fixture(scope="module")
def fleet(redis_server: str, tmp_path_factory: pytest.TempPathFactory):
    from tests.conftest import Fleet, new_db_url

    fleet = Fleet(
        new_db_url(redis_server),
        tmp_path_factory.mktemp("fleet"),
        {"ACTFLEET_REDISPATCH_AFTER": "1"},
    )
    try:
        fleet.start("ap1")
        yield fleet
    finally:
        fleet.stop()


@pytest.fixture
def client(fleet) -> Client:
    return Client(fleet.redis_url)


def test_ask_parks_the_turn_until_the_exact_call_is_approved(client: Client, tmp_path: Path):
    replay = write_replay(tmp_path / "r.jsonl", {"code": "print('approved ran')"}, {"text": "done"})
    handle = client.submit("go", model=f"replay:{replay}", approval="ask")
    request = first(client, handle.session_id, ev.ApprovalRequest)
    assert request.kind == "code" and request.args == {"code": "print('approved ran')"}
    pending = client.pending(handle.session_id)
    assert [p.id for p in pending] == [request.request_id]
    assert client.result(handle.turn_id) is None
    with pytest.raises(DecisionRefused, match="not the ones you decided on"):
        client.approve(request.request_id, args_sha256="0" * 64, approver="mallory")
    client.approve(request.request_id, args_sha256=request.args_sha256, approver="alice")
    result = client.wait(handle, timeout=60)
    assert result.status == "finished" and result.reason == "completed"
    with pytest.raises(DecisionRefused, match="already decided: approved by alice"):
        client.reject(request.request_id, args_sha256=request.args_sha256, approver="bob")
    decision = first(client, handle.session_id, ev.ApprovalDecision)
    assert (decision.approved, decision.approver) == (True, "alice")
    output = first(client, handle.session_id, ev.CodeExecutionOutput)
    assert output.text.strip() == "approved ran"
    assert client.pending(handle.session_id) == []


def test_decision_on_an_unknown_id_is_refused(client: Client):
    with pytest.raises(DecisionRefused, match="no approval request 'a-nope'"):
        client.approve("a-nope", args_sha256="x")


def files_written(fleet, session_id: str, name: str) -> list[Path]:
    """Files called `name` in the working directories of a session's agents, on any node."""
    return [p for p in fleet.workdir.rglob(name) if session_id in p.parts]


def test_rejection_ends_the_turn_and_the_model_is_told_why(fleet, client: Client, tmp_path: Path):
    write = "open('written-by-the-cell', 'w').close()"  # in the agent's working directory
    replay = write_replay(
        tmp_path / "r.jsonl", {"code": write}, {"code": write}, {"text": "approved, written"}
    )
    handle = client.submit("write", model=f"replay:{replay}", approval="ask")
    request = first(client, handle.session_id, ev.ApprovalRequest)
    client.reject(
        request.request_id, args_sha256=request.args_sha256, reason="no writes", approver="carol"
    )
    result = client.wait(handle, timeout=60)
    assert (result.status, result.reason) == ("finished", "rejected")
    output = first(client, handle.session_id, ev.CodeExecutionOutput)
    assert output.status == "rejected" and "carol: no writes" in output.text
    assert files_written(fleet, handle.session_id, "written-by-the-cell") == []

    # The control: the same cell, approved in the same session, writes the file looked for.
    cursor = client.last_event_id(handle.session_id)
    again = client.submit(
        "write", model=f"replay:{replay}", approval="ask", session_id=handle.session_id
    )
    request = first(client, handle.session_id, ev.ApprovalRequest, cursor)
    client.approve(request.request_id, args_sha256=request.args_sha256, approver="carol")
    assert client.wait(again, timeout=60).response == "approved, written"
    assert len(files_written(fleet, handle.session_id, "written-by-the-cell")) == 1


def test_expired_request_counts_as_rejected_with_an_event_saying_so(client: Client, tmp_path: Path):
    replay = write_replay(tmp_path / "r.jsonl", {"code": "print(1)"}, {"text": "n/a"})
    handle = client.submit("go", model=f"replay:{replay}", approval="ask", approval_timeout=0.5)
    result = client.wait(handle, timeout=60)
    assert result.reason == "rejected"
    decision = first(client, handle.session_id, ev.ApprovalDecision)
    assert not decision.approved and "expired" in decision.reason
    request = first(client, handle.session_id, ev.ApprovalRequest)
    with pytest.raises(DecisionRefused, match="already decided: expired"):
        client.approve(request.request_id, args_sha256=request.args_sha256)


def test_rules_deny_a_shell_part_without_asking_and_record_the_rule(client: Client, tmp_path: Path):
    policy = rules_file(tmp_path, 'deny = ["shell:rm *"]\nallow = ["code", "shell:echo *"]\n')
    replay = write_replay(
        tmp_path / "r.jsonl",
        {"code": "!echo one\n!echo two && rm -rf /tmp/nothing-here"},
        {"text": "n/a"},
    )
    handle = client.submit("go", model=f"replay:{replay}", approval=policy)
    result = client.wait(handle, timeout=60)
    assert result.reason == "rejected"
    events = list(client.events(handle.session_id, follow=False))
    assert not any(isinstance(e, ev.ApprovalRequest) for e in events)
    refused = next(e for e in events if isinstance(e, ev.ApprovalDecision))
    assert refused.approver == "policy" and "shell:rm *" in refused.reason
    output = next(e for e in events if isinstance(e, ev.CodeExecutionOutput))
    assert "one" in output.text and "denied by rule shell:rm *" in output.text


def test_rules_ask_for_a_shell_command_that_waits_past_the_execution_timeout(
    client: Client, tmp_path: Path
):
    policy = rules_file(tmp_path, 'ask = ["shell:echo *"]\nallow = ["code"]\n')
    replay = write_replay(
        tmp_path / "r.jsonl", {"code": "!echo ran-after-approval"}, {"text": "done"}
    )
    handle = client.submit("go", model=f"replay:{replay}", approval=policy, execution_timeout=2.0)
    request = first(client, handle.session_id, ev.ApprovalRequest)
    assert request.kind == "shell" and request.args == {"cmd": "echo ran-after-approval"}
    time.sleep(5)  # the human thinks for longer than the cell may run
    client.approve(request.request_id, args_sha256=request.args_sha256)
    result = client.wait(handle, timeout=60)
    assert result.reason == "completed"
    output = first(client, handle.session_id, ev.CodeExecutionOutput)
    assert output.status == "ok" and "ran-after-approval" in output.text


def test_decision_written_by_a_client_killed_at_once_still_resumes_the_turn(
    client: Client, tmp_path: Path
):
    replay = write_replay(tmp_path / "r.jsonl", {"code": "print('resumed')"}, {"text": "done"})
    handle = client.submit("go", model=f"replay:{replay}", approval="ask")
    request = first(client, handle.session_id, ev.ApprovalRequest)
    # A client that writes its decision and dies before it could send the step.
    script = (
        "import os, sys\n"
        "from actfleet.client import Client\n"
        "from actfleet.broker import transitions\n"
        "c = Client(sys.argv[1]); r = c.request(sys.argv[2])\n"
        "transitions.decide(c.keys, c.settings, r, status='approved',\n"
        "    args_sha=r.args_sha256, approver='dies', reason='', decision_id='x').run(c.redis)\n"
        "os._exit(9)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, client.settings.redis_url, request.request_id]
    )
    assert proc.returncode == 9
    assert client.wait(handle, timeout=60).reason == "completed"


def test_cli_lists_approves_all_of_a_kind_and_rejects(fleet, client: Client, tmp_path: Path):
    replay = write_replay(
        tmp_path / "r.jsonl",
        {"code": "print(1)"},
        {"text": "one"},
        {"code": "print(2)"},
        {"text": "two"},
    )
    handle = client.submit("one", model=f"replay:{replay}", approval="ask")
    request = first(client, handle.session_id, ev.ApprovalRequest)
    listed = cli(fleet.redis_url, "approvals", "--session", handle.session_id, "--json")
    assert listed.returncode == 0, listed.stderr
    [record] = [json.loads(line) for line in listed.stdout.splitlines()]
    assert record["id"] == request.request_id and record["args_sha256"] == request.args_sha256
    approved = cli(
        fleet.redis_url,
        "approve",
        "--all",
        "--session",
        handle.session_id,
        "--kind",
        "code",
        "--as",
        "dave",
    )
    assert approved.returncode == 0 and f"approved {request.request_id}" in approved.stdout
    assert client.wait(handle, timeout=60).response == "one"
    again = cli(fleet.redis_url, "approve", request.request_id)
    assert again.returncode == 3 and "already decided: approved by dave" in again.stderr
    second = client.submit(
        "two", model=f"replay:{replay}", approval="ask", session_id=handle.session_id
    )
    request = first(
        client,
        handle.session_id,
        ev.ApprovalRequest,
        after=handle_cursor(client, handle.session_id, second.turn_id),
    )
    rejected = cli(fleet.redis_url, "reject", request.request_id, "--reason", "not now")
    assert rejected.returncode == 0, rejected.stderr
    assert client.wait(second, timeout=60).reason == "rejected"


def handle_cursor(client: Client, session_id: str, turn_id: str) -> str:
    """The stream id of the turn's TurnStarted event."""
    started = next(
        e
        for e in client.events(session_id)
        if isinstance(e, ev.TurnStarted) and e.turn_id == turn_id
    )
    return started.id


def test_parked_turns_hold_no_worker_slot(redis_url: str, fleet_factory, tmp_path: Path):
    fleet = fleet_factory(redis_url)
    fleet.start("solo", "--concurrency", "1")
    client = Client(redis_url)
    ask = write_replay(tmp_path / "ask.jsonl", {"code": "print('x')"}, {"text": "x"})
    parked = [client.submit(f"p{i}", model=f"replay:{ask}", approval="ask") for i in range(10)]
    for handle in parked:
        first(client, handle.session_id, ev.ApprovalRequest)
    auto = write_replay(tmp_path / "auto.jsonl", {"code": "print('free')"}, {"text": "free"})
    free = client.submit("go", model=f"replay:{auto}", approval="auto")
    assert client.wait(free, timeout=60).response == "free"
    assert all(client.result(h.turn_id) is None for h in parked)
    assert len(client.pending()) == 10
    # 11 agents on 8 kernels: parked agents whose kernel ran nothing made room, and lose
    # nothing: once approved, none is told its kernel restarted.
    for request in client.pending():
        client.approve(request.id, args_sha256=request.args_sha256)
    for handle in parked:
        assert client.wait(handle, timeout=60).response == "x"
        events = client.events(handle.session_id, follow=False)
        assert not [e for e in events if isinstance(e, ev.KernelRestarted)]


def test_parked_turn_resumes_on_another_node_after_its_node_died(
    redis_url: str, fleet_factory, tmp_path: Path
):
    fleet = fleet_factory(redis_url)
    fleet.start("p1")
    fleet.start("p2")
    client = Client(redis_url)
    replay = write_replay(
        tmp_path / "r.jsonl",
        {"code": "x = 1"},
        {"text": "parked"},
        {"code": "print('after')"},
        {"text": "finished"},
    )
    handle = client.submit("one", model=f"replay:{replay}", approval="auto")
    client.wait(handle, timeout=60)
    holder = first(client, handle.session_id, ev.CodeExecutionOutput).node
    second = client.submit(
        "two", model=f"replay:{replay}", approval="ask", session_id=handle.session_id
    )
    request = first(client, handle.session_id, ev.ApprovalRequest)
    fleet.kill(holder)
    client.approve(request.request_id, args_sha256=request.args_sha256)
    assert client.wait(second, timeout=60).response == "finished"
    events = list(client.events(handle.session_id, follow=False))
    last_output = [e for e in events if isinstance(e, ev.CodeExecutionOutput)][-1]
    assert last_output.node != holder and "kernel was restarted" in last_output.text
    assert [e.seq for e in events] == list(range(1, len(events) + 1))


def in_terminal(redis_url: str, *args: str) -> pexpect.spawn:
    """`actfleet ARGS` in a pseudo-terminal, as a person would run it (colours off)."""
    env = {**os.environ, "ACTFLEET_REDIS_URL": redis_url, "COLUMNS": "120", "NO_COLOR": "1"}
    return pexpect.spawn(
        sys.executable, ["-m", "actfleet", *args], env=env, encoding="utf-8", timeout=30
    )


def test_interactive_walker_approves_and_approves_later_matching_requests(
    fleet, client: Client, tmp_path: Path
):
    policy = rules_file(tmp_path, 'ask = ["shell:echo *"]\nallow = ["code"]\n')
    replay = write_replay(
        tmp_path / "r.jsonl", {"code": "!echo one\n!echo two\n!echo three"}, {"text": "walked"}
    )
    handle = client.submit("walk", model=f"replay:{replay}", approval=policy)
    walker = in_terminal(
        fleet.redis_url,
        "approvals",
        "--interactive",
        "--session",
        handle.session_id,
        "--as",
        "erin",
    )
    walker.expect("echo one")
    walker.expect("approve\\?")
    walker.sendline("y")
    walker.expect("approved")
    walker.expect("echo two")
    walker.expect("approve\\?")
    walker.sendline("a")
    walker.expect("matching")
    walker.sendline("")  # accept the suggested pattern, shell:echo *
    walker.expect("approved .* and later ones matching shell:echo \\*")
    walker.expect("approved .* matches shell:echo \\*")
    assert client.wait(handle, timeout=60).response == "walked"
    walker.sendline("q")
    walker.close(force=True)
    decisions = [
        e
        for e in client.events(handle.session_id, follow=False)
        if isinstance(e, ev.ApprovalDecision)
    ]
    assert [d.approver for d in decisions] == ["erin"] * 3


def test_run_in_a_terminal_asks_inline_and_a_rejection_ends_the_turn(fleet, tmp_path: Path):
    replay = write_replay(tmp_path / "r.jsonl", {"code": "print('never')"}, {"text": "n/a"})
    run = in_terminal(fleet.redis_url, "run", "try it", "--model", f"replay:{replay}")
    run.expect("print\\('never'\\)")
    run.expect("approve\\?")
    run.sendline("n")
    run.expect("reason")
    run.sendline("not today")
    run.expect("rejected by .*: not today")
    run.expect("turn not completed: a request was rejected")
    run.expect(pexpect.EOF)
    run.close()
    assert run.exitstatus == 4
