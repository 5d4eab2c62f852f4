"""Subagents as separate tasks under caps that are leases; max_turns; cancellation."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from actfleet.broker import events as ev
from actfleet.client import Client
from tests.conftest import cli, wait_for, write_replay


def fan_out(n: int, cell: str = "import time; time.sleep(0.3); print('child done')") -> list[dict]:
    """A replay: the main agent spawns n subagents in one response, then answers; each
    subagent runs one cell and answers."""
    return [
        {
            "tool_calls": [
                {"name": "subagent_task", "args": {"prompt": f"task {i}"}} for i in range(n)
            ]
        },
        {"text": "all subagents answered"},
        {"agent": "sub", "code": cell},
        {"agent": "sub", "text": "sub answer"},
    ]


def max_overlap(events: list[ev.Event]) -> int:
    """The most subagents running at one moment, from SubagentStarted/Finished timestamps."""
    marks = sorted(
        [(e.ts, 1) for e in events if isinstance(e, ev.SubagentStarted)]
        + [(e.ts, -1) for e in events if isinstance(e, ev.SubagentFinished)],
        key=lambda m: (m[0], m[1]),
    )
    running = peak = 0
    for _, step in marks:
        running += step
        peak = max(peak, running)
    return peak


@pytest.fixture(scope="module")
def fleet(redis_server: str, tmp_path_factory: pytest.TempPathFactory):
    from tests.conftest import Fleet, new_db_url

    fleet = Fleet(
        new_db_url(redis_server),
        tmp_path_factory.mktemp("fleet"),
        {"ACTFLEET_REDISPATCH_AFTER": "2"},
    )
    try:
        fleet.start("s1", "--concurrency", "6")
        fleet.start("s2", "--concurrency", "6")
        yield fleet
    finally:
        fleet.stop()


def slots_held(url: str) -> int:
    r = redis.Redis.from_url(url)
    return sum(r.zcard(k) for k in r.scan_iter("actfleet:slots*"))


def test_twenty_subagents_with_cap_three_never_exceed_it_and_all_report(fleet, tmp_path: Path):
    replay = write_replay(tmp_path / "r.jsonl", *fan_out(20))
    client = Client(fleet.redis_url)
    handle = client.submit("fan out", model=f"replay:{replay}", approval="auto", max_subagents=3)
    result = client.wait(handle, timeout=180)
    assert (result.status, result.response) == ("finished", "all subagents answered")
    events = list(client.events(handle.session_id, follow=False))
    started = [e for e in events if isinstance(e, ev.SubagentStarted)]
    finished = [e for e in events if isinstance(e, ev.SubagentFinished)]
    assert len(started) == len(finished) == 20
    assert all(f.response == "sub answer" for f in finished)
    assert max_overlap(events) <= 3
    calls = {e.corr_id for e in events if isinstance(e, ev.ToolCall)}
    assert {s.parent_corr_id for s in started} == calls
    sub_outputs = [e for e in events if isinstance(e, ev.CodeExecutionOutput)]
    assert len(sub_outputs) == 20 and all(o.agent_id.startswith("sub-") for o in sub_outputs)
    assert all(o.parent_corr_id in calls for o in sub_outputs)
    assert result.usage["requests"] == 2 + 20 * 2
    # Replayed steps have no price: unknown (None), counted with the children's, never $0.
    assert (result.usage["cost"], result.usage["unpriced"]) == (None, 2 + 20 * 2)
    assert client.session_usage(handle.session_id) == result.usage
    assert slots_held(fleet.redis_url) == 0


def test_subagent_kernel_does_not_see_the_parents_variables(fleet, tmp_path: Path):
    replay = write_replay(
        tmp_path / "r.jsonl",
        {"code": "parent_secret = 42"},
        {"tool_calls": [{"name": "subagent_task", "args": {"prompt": "look"}}]},
        {"text": "checked"},
        {"agent": "sub", "code": "print('parent_secret' in globals())"},
        {"agent": "sub", "text": "looked"},
    )
    client = Client(fleet.redis_url)
    handle = client.submit("isolate", model=f"replay:{replay}", approval="auto")
    assert client.wait(handle, timeout=60).response == "checked"
    outputs = [
        e
        for e in client.events(handle.session_id, follow=False)
        if isinstance(e, ev.CodeExecutionOutput) and e.agent_id.startswith("sub-")
    ]
    assert outputs[0].text.strip() == "False"


def test_nested_subagent_task_is_refused(fleet, tmp_path: Path):
    replay = write_replay(
        tmp_path / "r.jsonl",
        {"tool_calls": [{"name": "subagent_task", "args": {"prompt": "nest"}}]},
        {"text": "parent done"},
        {"agent": "sub", "tool_calls": [{"name": "subagent_task", "args": {"prompt": "deeper"}}]},
        {"agent": "sub", "text": "could not nest"},
    )
    client = Client(fleet.redis_url)
    handle = client.submit("nest", model=f"replay:{replay}", approval="auto")
    assert client.wait(handle, timeout=60).response == "parent done"
    events = list(client.events(handle.session_id, follow=False))
    refusal = next(
        e for e in events if isinstance(e, ev.ToolOutput) and e.agent_id.startswith("sub-")
    )
    assert "cannot nest" in refusal.content
    assert sum(isinstance(e, ev.SubagentStarted) for e in events) == 1


def test_max_turns_ends_the_turn_with_its_reason(fleet, tmp_path: Path):
    replay = write_replay(
        tmp_path / "r.jsonl",
        {"text": "one", "code": "x = 1"},
        {"text": "two", "code": "x = 2"},
        {"text": "never"},
    )
    client = Client(fleet.redis_url)
    handle = client.submit("loop", model=f"replay:{replay}", approval="auto", max_turns=2)
    result = client.wait(handle, timeout=60)
    assert (result.status, result.reason) == ("finished", "max_turns")


def test_subagent_rejection_is_reported_to_the_parent_call(fleet, tmp_path: Path):
    rules = tmp_path / "rules.toml"
    rules.write_text('deny = ["shell:rm *"]\nallow = ["code", "subagent"]\n')
    replay = write_replay(
        tmp_path / "r.jsonl",
        {"tool_calls": [{"name": "subagent_task", "args": {"prompt": "clean"}}]},
        {"text": "parent saw it"},
        {"agent": "sub", "code": "!rm -rf /tmp/nothing-here"},
        {"agent": "sub", "text": "unreachable"},
    )
    client = Client(fleet.redis_url)
    handle = client.submit("clean", model=f"replay:{replay}", approval=str(rules))
    assert client.wait(handle, timeout=60).response == "parent saw it"
    events = list(client.events(handle.session_id, follow=False))
    finished = next(e for e in events if isinstance(e, ev.SubagentFinished))
    assert finished.status == "rejected"
    output = next(e for e in events if isinstance(e, ev.ToolOutput))
    assert "rejected" in output.content


def test_cancel_stops_every_agent_and_frees_every_slot(fleet, tmp_path: Path):
    spawn, _, *sub = fan_out(3, "import time; print('running', flush=True); time.sleep(60)")
    after = [{"code": "print('after cancel')"}, {"text": "new turn works"}]
    replay = write_replay(tmp_path / "r.jsonl", spawn, *after, *sub)
    client = Client(fleet.redis_url)
    handle = client.submit("fan out", model=f"replay:{replay}", approval="auto")
    running = set()
    for event in client.events(handle.session_id):
        if isinstance(event, ev.CodeExecutionOutputChunk):
            running.add(event.agent_id)
            if len(running) == 3:
                break
    seen = event.seq
    proc = cli(fleet.redis_url, "cancel", handle.session_id)
    assert proc.returncode == 0, proc.stderr
    agents = {"main", *running}

    def all_cancelled() -> list[ev.Event]:
        done = [
            e for e in client.events(handle.session_id, follow=False) if isinstance(e, ev.Cancelled)
        ]
        return done if {e.agent_id for e in done} == agents else []

    cancelled = wait_for(all_cancelled, 10, "a Cancelled event from every agent")
    assert len(cancelled) == 4 and all(e.seq > seen for e in cancelled)
    assert {e.phase for e in cancelled if e.agent_id != "main"} == {"tool_execution"}
    events = list(client.events(handle.session_id, follow=False))
    # The cells were stopped, not run to their end, and each agent stopped at its Cancelled.
    assert not any(isinstance(e, ev.CodeExecutionOutput) and e.status == "ok" for e in events)
    finished = [e for e in events if isinstance(e, ev.SubagentFinished)]
    assert {e.agent_id for e in finished} == running
    assert {e.status for e in finished} == {"cancelled"}
    for stop in cancelled:
        after = [e for e in events if e.agent_id == stop.agent_id and e.seq > stop.seq]
        assert all(isinstance(e, ev.SubagentFinished) for e in after), after
    wait_for(lambda: slots_held(fleet.redis_url) == 0, 5, "every slot to be freed")
    assert client.result(handle.turn_id).status == "cancelled"
    again = client.submit(
        "again", model=f"replay:{replay}", approval="auto", session_id=handle.session_id
    )
    assert client.wait(again, timeout=60).response == "new turn works"


def test_killed_node_running_a_subagent_loses_nothing_and_frees_its_slot(
    redis_url: str, fleet_factory, tmp_path: Path
):
    fleet = fleet_factory(redis_url)
    fleet.start("k1")
    fleet.start("k2")
    replay = write_replay(
        tmp_path / "r.jsonl", *fan_out(1, "import time; print('sub', flush=True); time.sleep(60)")
    )
    client = Client(redis_url)
    handle = client.submit("one", model=f"replay:{replay}", approval="auto")
    chunk = next(
        e for e in client.events(handle.session_id) if isinstance(e, ev.CodeExecutionOutputChunk)
    )
    fleet.kill(chunk.node)
    result = client.wait(handle, timeout=90)
    assert result.response == "all subagents answered"
    events = list(client.events(handle.session_id, follow=False))
    output = next(e for e in events if isinstance(e, ev.CodeExecutionOutput))
    assert output.status == "lost" and output.node != chunk.node
    wait_for(lambda: slots_held(redis_url) == 0, 15, "the slot to be freed")


def test_storm_of_fifty_subagents_with_kills_and_cancels_leaves_no_slot_held(
    redis_url: str, fleet_factory, tmp_path: Path
):
    fleet = fleet_factory(redis_url)
    for name in ("m1", "m2"):
        fleet.start(name, "--concurrency", "6")
    replay = write_replay(
        tmp_path / "r.jsonl", *fan_out(10, "import time; print('x', flush=True); time.sleep(1)")
    )
    client = Client(redis_url)
    handles = [
        client.submit(f"storm {i}", model=f"replay:{replay}", approval="auto", max_subagents=3)
        for i in range(5)
    ]
    first_chunk = next(
        e
        for e in client.events(handles[0].session_id)
        if isinstance(e, ev.CodeExecutionOutputChunk)
    )
    fleet.kill(first_chunk.node)
    fleet.start("m3", "--concurrency", "6")
    client.cancel(handles[1].session_id)
    client.cancel(handles[2].session_id)
    results = [client.wait(h, timeout=240) for h in handles]
    assert [r.status for r in results[1:3]] == ["cancelled", "cancelled"]
    assert all(r.status == "finished" for r in results[3:])
    wait_for(lambda: slots_held(redis_url) == 0, 15, "every slot to be freed")
    r = redis.Redis.from_url(redis_url)
    assert all(r.llen(k) == 0 for k in r.scan_iter("actfleet:childq:*"))


def test_cancelled_cell_is_interrupted_and_the_kernel_keeps_its_state(fleet, tmp_path: Path):
    replay = write_replay(
        tmp_path / "r.jsonl",
        {"code": "kept = 'still here'\nimport time\nprint('sleeping', flush=True)\ntime.sleep(60)"},
        {"code": "print(kept)"},
        {"text": "state kept"},
    )
    client = Client(fleet.redis_url)
    handle = client.submit("sleep", model=f"replay:{replay}", approval="auto")
    next(e for e in client.events(handle.session_id) if isinstance(e, ev.CodeExecutionOutputChunk))
    client.cancel(handle.session_id)
    assert client.wait(handle, timeout=30).status == "cancelled"
    again = client.submit(
        "print it", model=f"replay:{replay}", approval="auto", session_id=handle.session_id
    )
    assert client.wait(again, timeout=60).response == "state kept"
    outputs = [
        e
        for e in client.events(handle.session_id, follow=False)
        if isinstance(e, ev.CodeExecutionOutput)
    ]
    assert outputs[-1].text.strip() == "still here"
