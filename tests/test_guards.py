"""The guards, end to end on a real fleet: a step that is not its turn's current step runs
nothing and changes nothing; one broken approval record stops no sweep and no listing; a
junk stream entry stops no reader."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from actfleet.broker import events as ev
from actfleet.broker.records import StepRef, TurnRecord
from actfleet.client import Client
from tests.conftest import cli, wait_for, write_replay


@pytest.fixture
def fleet(redis_url: str, fleet_factory):
    fleet = fleet_factory(redis_url, {"ACTFLEET_REDISPATCH_AFTER": "1"})
    fleet.start("n1")
    return fleet


def first(client: Client, session_id: str, cls: type) -> ev.Event:
    for event in client.events(session_id):
        if isinstance(event, cls):
            return event
    raise AssertionError("stream ended")


def turn(r: redis.Redis, turn_id: str) -> TurnRecord:
    return TurnRecord.from_hash(r.hgetall(f"actfleet:turn:{turn_id}"), turn_id)


def refused(fleet, ref: StepRef) -> bool:
    log = fleet.log("n1")
    return f"refused step {ref.encode()}" in log or f"skipped step {ref.encode()}" in log


MARKING_CELL = {"code": "open('mark', 'a').write('ran\\n')"}
"""Leaves a line in the agent's working directory each time it runs."""


def test_a_duplicate_of_a_parked_turns_execution_step_runs_nothing(fleet, tmp_path: Path):
    client = Client(fleet.redis_url)
    replay = write_replay(tmp_path / "r.jsonl", MARKING_CELL, {"text": "done"})
    handle = client.submit("go", model=f"replay:{replay}", approval="ask")
    request = first(client, handle.session_id, ev.ApprovalRequest)
    parked = turn(fleet.redis, handle.turn_id)
    assert parked.status == "parked"
    duplicate = StepRef(handle.session_id, "main", handle.turn_id, parked.step_no, "execution")
    client._send_step(duplicate)
    wait_for(lambda: refused(fleet, duplicate), 30, "the node to refuse the duplicate")
    assert not fleet.agent_file(handle.session_id, "mark").exists()
    assert client.request(request.request_id).status == "pending"

    client.approve(request.request_id, args_sha256=request.args_sha256, approver="t")
    assert client.wait(handle, timeout=60).response == "done"
    assert fleet.agent_file(handle.session_id, "mark").read_text() == "ran\n"


def test_a_step_sent_for_a_finished_turn_changes_nothing(fleet, tmp_path: Path):
    client = Client(fleet.redis_url)
    replay = write_replay(tmp_path / "r.jsonl", MARKING_CELL, {"text": "done"})
    handle = client.submit("go", model=f"replay:{replay}", approval="auto")
    assert client.wait(handle, timeout=60).response == "done"
    ended = turn(fleet.redis, handle.turn_id)
    forged = [
        StepRef.first(handle.session_id, "main", handle.turn_id),
        StepRef(handle.session_id, "main", handle.turn_id, ended.step_no, "execution"),
        StepRef(handle.session_id, "main", handle.turn_id, ended.step_no + 1, "model"),
    ]
    for ref in forged:
        client._send_step(ref)
    for ref in forged:
        wait_for(lambda ref=ref: refused(fleet, ref), 30, f"the node to refuse {ref.encode()}")
    assert turn(fleet.redis, handle.turn_id) == ended
    assert fleet.agent_file(handle.session_id, "mark").read_text() == "ran\n"
    events = list(client.events(handle.session_id, follow=False))
    assert sum(isinstance(e, ev.TurnFinished | ev.TurnFailed) for e in events) == 1


def test_a_broken_approval_record_stops_neither_the_sweep_nor_the_listing(fleet, tmp_path: Path):
    client = Client(fleet.redis_url)
    replay = write_replay(tmp_path / "r.jsonl", {"code": "print(1)"}, {"text": "done"})
    broken = client.submit("a", model=f"replay:{replay}", approval="ask")
    broken_request = first(client, broken.session_id, ev.ApprovalRequest)
    fleet.redis.hdel(f"actfleet:approval:{broken_request.request_id}", "args_sha256", "kind")
    fleet.redis.zrem("actfleet:approvals:expiry", broken_request.request_id)

    handle = client.submit("b", model=f"replay:{replay}", approval="ask")
    request = first(client, handle.session_id, ev.ApprovalRequest)
    listed = cli(fleet.redis_url, "approvals", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [json.loads(line)["id"] for line in listed.stdout.splitlines()] == [request.request_id]
    assert broken_request.request_id in listed.stderr

    # A client that writes its decision and dies before it could send the step: only the
    # heartbeat's sweep can resume the turn, past the broken record.
    script = (
        "import os, sys\n"
        "from actfleet.client import Client\n"
        "from actfleet.broker import transitions\n"
        "c = Client(sys.argv[1]); r = c.request(sys.argv[2])\n"
        "transitions.decide(c.keys, c.settings, r, status='approved',\n"
        "    args_sha=r.args_sha256, approver='dies', reason='', decision_id='x').run(c.redis)\n"
        "os._exit(9)\n"
    )
    died = subprocess.run([sys.executable, "-c", script, fleet.redis_url, request.request_id])
    assert died.returncode == 9
    assert client.wait(handle, timeout=60).response == "done"
    assert fleet.nodes["n1"].poll() is None


def test_watch_prints_every_event_around_a_junk_stream_entry_and_a_notice(fleet, tmp_path: Path):
    client = Client(fleet.redis_url)
    replay = write_replay(
        tmp_path / "r.jsonl", {"code": "print(1)"}, {"text": "one"}, {"text": "two"}
    )
    handle = client.submit("one", model=f"replay:{replay}", approval="auto")
    client.wait(handle, timeout=60)
    first_turn = list(client.events(handle.session_id, follow=False))
    fleet.redis.xadd(f"actfleet:stream:{handle.session_id}", {"e": b"\xff not msgpack"})
    second = client.submit("two", session_id=handle.session_id, model=f"replay:{replay}")
    client.wait(second, timeout=60)
    second_turn = list(client.events(handle.session_id, follow=False))[len(first_turn) + 1 :]

    watched = cli(fleet.redis_url, "watch", handle.session_id, "--no-follow", "--json")
    assert watched.returncode == 0, watched.stderr
    types = [json.loads(line)["type"] for line in watched.stdout.splitlines()]
    assert types == [
        *(type(e).__name__ for e in first_turn),
        "Unreadable",
        *(type(e).__name__ for e in second_turn),
    ]
    assert "TurnFinished" in types[-3:]


def test_a_dispatch_entry_for_no_current_step_is_dead_lettered_not_sent_forever(fleet):
    client = Client(fleet.redis_url)
    ghost = "s-ghost|main|t-ghost|1|model"  # a step of a turn that does not exist
    fleet.redis.zadd("actfleet:dispatch", {ghost: 1})

    def dead_lettered() -> bool:
        return any(ghost in str(entry) for entry in client.dead_letters(100))

    wait_for(dead_lettered, 30, "the sweep to dead-letter the ghost step")
    assert fleet.redis.zscore("actfleet:dispatch", ghost) is None
    assert f"sending {ghost} again" not in fleet.log("n1")
