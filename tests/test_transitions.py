"""Each transition's Lua script on its own, against a real redis-server: fast, no workers."""

from __future__ import annotations

import time

import pytest
import redis

from actfleet.broker import events as ev
from actfleet.broker import transitions as tr
from actfleet.broker.keys import Keys
from actfleet.broker.records import ApprovalRecord, StepRef, TurnRecord
from actfleet.broker.settings import Settings
from actfleet.broker.stream import read_events

KEYS = Keys()
SETTINGS = Settings(retention=60)


@pytest.fixture
def r(redis_url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_url)


def turn(turn_id: str, session: str = "s", agent: str = "main", **fields) -> TurnRecord:
    return TurnRecord(
        session_id=session,
        agent_id=agent,
        turn_id=turn_id,
        prompt="p",
        model="m",
        created_at=time.time(),
        **fields,
    )


def submit(r: redis.Redis, turn_id: str, **fields) -> str:
    record = turn(turn_id, **fields)
    started = ev.TurnStarted(session_id="s", turn_id=turn_id, prompt="p", model="m")
    return tr.submit(KEYS, SETTINGS, record, started).run(r)


def claim(r: redis.Redis, ref: StepRef, node: str = "n", boot: str = "b") -> tr.Claim:
    return tr.claim(KEYS, ref, node, boot).run(r)


def commit(r: redis.Redis, ref: StepRef, outcome: tr.Outcome) -> tr.Committed:
    record = TurnRecord.from_hash({**r.hgetall(KEYS.turn(ref.turn_id)), b"turn_id": ref.turn_id})
    return tr.commit(KEYS, SETTINGS, "n", record, ref, outcome).run(r)


def dispatched(r: redis.Redis) -> set[str]:
    return {m.decode() for m in r.zrange(KEYS.dispatch(), 0, -1)}


def types(r: redis.Redis, session: str = "s") -> list[str]:
    return [e.type for e in read_events(r, KEYS, session, follow=False)]


def test_submit_starts_an_idle_agents_turn_and_queues_the_next_and_is_idempotent(r):
    assert submit(r, "t1") == "started"
    assert submit(r, "t2") == "queued"
    assert submit(r, "t1") == "exists"
    assert dispatched(r) == {"s|main|t1|1|model"}
    assert types(r) == ["TurnStarted"]


def test_claim_refuses_a_step_that_is_not_the_turns_current_step(r):
    submit(r, "t1")
    for ref, why in [
        (StepRef("s", "main", "t1", 2, "model"), "not the current step"),
        (StepRef("s", "main", "t1", 1, "execution"), "not the current step"),
        (StepRef("s", "main", "nope", 1, "model"), "does not exist"),
    ]:
        got = claim(r, ref)
        assert (got.verdict, why in got.detail) == ("refused", True)
    assert not r.exists(KEYS.step("t1:2:model"))


def test_claim_refuses_the_steps_of_queued_parked_and_ended_turns(r):
    submit(r, "t1")
    submit(r, "t2")
    assert claim(r, StepRef.first("s", "main", "t2")).detail == "the turn is queued"
    r.hset(KEYS.turn("t1"), mapping={"status": "parked", "step_no": 2, "step_kind": "execution"})
    assert claim(r, StepRef("s", "main", "t1", 2, "execution")).detail == "the turn is parked"
    r.hset(KEYS.turn("t1"), "status", "finished")
    assert claim(r, StepRef("s", "main", "t1", 2, "execution")).detail == "the turn is finished"


def test_claim_refuses_an_execution_step_while_a_request_is_pending(r):
    submit(r, "t1")
    r.hset(KEYS.turn("t1"), mapping={"step_no": 2, "step_kind": "execution", "waiting": 1})
    got = claim(r, StepRef("s", "main", "t1", 2, "execution"))
    assert (got.verdict, got.detail) == ("refused", "1 approval request(s) still pending")


def test_claim_by_a_live_node_is_busy_and_a_dead_owners_step_is_taken_over(r):
    submit(r, "t1")
    ref = StepRef.first("s", "main", "t1")
    r.set(KEYS.node("a"), "boot-a")
    first = claim(r, ref, "a", "boot-a")
    assert (first.verdict, first.turn.status) == ("ok", "running")
    assert claim(r, ref, "a", "boot-a").verdict == "mine"
    busy = claim(r, ref, "b", "boot-b")
    assert (busy.verdict, busy.detail) == ("busy", "a")
    r.delete(KEYS.node("a"))
    taken = claim(r, ref, "b", "boot-b")
    assert (taken.verdict, taken.detail) == ("ok", "a")


def test_claim_of_a_cancelled_sessions_turn_says_cancel(r):
    submit(r, "t1")
    r.set(KEYS.cancel("s"), time.time() + 1)
    assert claim(r, StepRef.first("s", "main", "t1")).verdict == "cancel"


def test_commit_advances_once_and_a_retry_returns_the_same_sends(r):
    submit(r, "t1")
    ref = StepRef.first("s", "main", "t1")
    claim(r, ref)
    outcome = tr.Advance("execution", [b"{}"], [ev.Response(session_id="s", content="x")])
    first = commit(r, ref, outcome)
    again = commit(r, ref, outcome)
    nxt = StepRef("s", "main", "t1", 2, "execution")
    assert (first.state, first.sends) == ("committed", [nxt])
    assert (again.state, again.sends) == ("done", [nxt])
    assert r.llen(KEYS.history("s", "main")) == 1
    assert dispatched(r) == {nxt.encode()}
    assert claim(r, ref).verdict == "done"


def test_commit_that_ends_a_turn_starts_the_next_queued_one(r):
    submit(r, "t1")
    submit(r, "t2")
    ref = StepRef.first("s", "main", "t1")
    claim(r, ref)
    got = commit(r, ref, tr.End("finished", reason="completed", response="hi"))
    assert got.sends == [StepRef.first("s", "main", "t2")]
    assert types(r) == ["TurnStarted", "TurnFinished", "TurnStarted"]
    assert r.hget(KEYS.agent("s", "main"), "active_turn") == b"t2"
    assert r.ttl(KEYS.turn("t1")) > 0


def test_a_turn_that_ended_takes_no_more_commits(r):
    submit(r, "t1")
    ref = StepRef.first("s", "main", "t1")
    claim(r, ref)
    commit(r, ref, tr.End("finished", reason="completed"))
    forged = StepRef("s", "main", "t1", 2, "model")
    r.hset(KEYS.step(forged.id), "state", "running")
    assert commit(r, forged, tr.End("failed", error="x")).state == "stale"
    assert types(r).count("TurnFinished") == 1 and "TurnFailed" not in types(r)


def test_the_last_turns_end_gives_the_sessions_keys_the_retention_expiry(r):
    submit(r, "t1")
    ref = StepRef.first("s", "main", "t1")
    claim(r, ref)
    commit(r, ref, tr.End("finished", reason="completed", history=[b"{}"]))
    for key in (KEYS.stream("s"), KEYS.history("s", "main"), KEYS.agent("s", "main")):
        assert 0 < r.ttl(key) <= 60, key
    submit(r, "t2")
    assert r.ttl(KEYS.stream("s")) == -1


def park_for_approval(r: redis.Redis) -> ApprovalRecord:
    submit(r, "t1")
    ref = StepRef.first("s", "main", "t1")
    claim(r, ref)
    record = ApprovalRecord.new(
        session_id="s",
        agent_id="main",
        turn_id="t1",
        kind="code",
        tool_name="execute_ipython_cell",
        args={"code": "1"},
        timeout=None,
        dispatch=ref.next("execution").encode(),
    )
    got = commit(r, ref, tr.Park("execution", 1, requests=[record]))
    assert (got.sends, r.hget(KEYS.turn("t1"), "status")) == ([], b"parked")
    return ApprovalRecord.from_hash(r.hgetall(KEYS.approval(record.id)))


def decide(r: redis.Redis, record: ApprovalRecord, sha: str, decision_id: str = "d1", **kw):
    return tr.decide(
        KEYS,
        SETTINGS,
        record,
        status=kw.pop("status", "approved"),
        args_sha=sha,
        approver=kw.pop("approver", "alice"),
        reason="",
        decision_id=decision_id,
    ).run(r)


def test_decision_for_other_arguments_is_refused_and_the_first_decision_wins(r):
    record = park_for_approval(r)
    assert decide(r, record, "0" * 64).verdict == "hash"
    first = decide(r, record, record.args_sha256)
    assert (first.verdict, first.resume) == ("resume", StepRef("s", "main", "t1", 2, "execution"))
    retry = decide(r, record, record.args_sha256)
    assert retry.resume == first.resume
    later = decide(r, record, record.args_sha256, decision_id="d2", approver="bob")
    assert (later.verdict, later.status, later.detail) == ("decided", "approved", "alice")
    assert claim(r, first.resume).verdict == "ok"


def test_a_rejection_resumes_the_turn_to_end_it(r):
    record = park_for_approval(r)
    got = decide(r, record, record.args_sha256, status="rejected")
    assert got.verdict == "resume"
    assert r.hget(KEYS.turn("t1"), "rejected") == b"1"


def test_spawned_children_start_under_the_cap_and_the_last_report_resumes_the_parent(r):
    submit(r, "t1")
    r.hset(KEYS.turn("t1"), mapping={"status": "parked", "step_no": 3, "step_kind": "collect"})
    r.hset(KEYS.turn("t1"), "waiting", 3)
    for i in range(3):
        child = turn(
            f"c{i}",
            agent=f"sub-{i}",
            parent_turn="t1",
            parent_agent="main",
            parent_call=f"call{i}",
            parent_step=2,
            max_subagents=2,
        )
        started = ev.SubagentStarted(session_id="s", subagent_id=f"sub-{i}", prompt="p")
        assert tr.spawn(KEYS, child, started, cap=2).run(r)
        assert not tr.spawn(KEYS, child, started, cap=2).run(r)
    first = tr.pump(KEYS, SETTINGS, "s", "main", 2).run(r)
    assert [ref.agent_id for ref in first] == ["sub-0", "sub-1"]
    sends: list[StepRef] = []
    for ref in first:
        claim(r, ref)
        sends += commit(r, ref, tr.End("finished", reason="completed", response="ok")).sends
        sends += tr.pump(KEYS, SETTINGS, "s", "main", 2).run(r)
    assert [s.agent_id for s in sends] == ["sub-2"]
    claim(r, sends[0])
    last = commit(r, sends[0], tr.End("finished", reason="completed", response="ok"))
    assert last.sends == [StepRef("s", "main", "t1", 3, "collect")]
    assert r.hlen(KEYS.step_results("t1:2:execution")) == 3


def test_cancel_wakes_a_parked_turn_with_its_current_step(r):
    park_for_approval(r)
    woken = tr.cancel(KEYS, SETTINGS, "s").run(r)
    assert woken == [StepRef("s", "main", "t1", 2, "execution")]
    assert claim(r, woken[0]).verdict == "cancel"


def test_a_lease_is_held_by_one_live_node_and_taken_over_from_a_dead_one(r):
    lease = tr.take_lease
    r.set(KEYS.node("a"), "1")
    assert lease(KEYS, "s", "main", node="a", boot="1", ttl=5).run(r) == ("acquired", "")
    assert lease(KEYS, "s", "main", node="a", boot="1", ttl=5).run(r) == ("held", "")
    assert lease(KEYS, "s", "main", node="b", boot="2", ttl=5).run(r) == ("other", "a")
    r.delete(KEYS.node("a"))
    assert lease(KEYS, "s", "main", node="b", boot="2", ttl=5).run(r) == ("acquired", "a|1")
