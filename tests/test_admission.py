"""Admission without eviction: agents that do not fit wait in Redis, and a runtime whose
agent has a turn in progress is never evicted."""

from __future__ import annotations

from pathlib import Path

from actfleet.broker.events import CodeExecutionOutput, KernelRestarted, TurnFinished
from actfleet.client import Client
from tests.conftest import events_of, new_db_url, write_replay


def test_more_sessions_than_kernels_all_keep_their_kernel_mid_turn(
    redis_server: str, fleet_factory, tmp_path: Path
):
    """8 sessions, each `x = 41` then `print(x + 1)` in one turn, on one node with 2
    kernels: all print 42, none sees its kernel restarted, and the node ends holding at
    most 2 agents (they arrive together: each check for room must count the others). The
    next turn of a session whose agent went idle meanwhile is told its kernel was evicted."""
    fleet = fleet_factory(new_db_url(redis_server))
    fleet.start("n1", "--kernels", "2")
    replay = write_replay(
        tmp_path / "two-cells.jsonl",
        {"code": "x = 41"},
        {"code": "print(x + 1)"},
        {"text": "done"},
        {"code": "print('again')"},
        {"text": "done again"},
    )
    client = Client(fleet.redis_url)
    handles = [
        client.submit("two cells", model=f"replay:{replay}", approval="auto") for _ in range(8)
    ]
    for handle in handles:
        assert client.wait(handle, timeout=120).status == "finished"
    for handle in handles:
        events = events_of(client, handle.session_id)
        outputs = [e.text for e in events if isinstance(e, CodeExecutionOutput)]
        assert outputs == ["", "42\n"], (handle.session_id, outputs)
        assert not [e for e in events if isinstance(e, KernelRestarted)]

    held = {m.decode().split("/")[0] for m in fleet.redis.smembers("actfleet:nodeagents:n1")}
    assert len(held) <= 2, held  # never more agents than kernels, even arriving together
    first = next(h for h in handles if h.session_id not in held)  # an evicted one
    again = client.submit(
        "once more", model=f"replay:{replay}", session_id=first.session_id, approval="auto"
    )
    assert client.wait(again, timeout=60).status == "finished"
    events = events_of(client, first.session_id)
    restarted = [e for e in events if isinstance(e, KernelRestarted)]
    assert restarted and "evicted" in restarted[0].reason
    assert isinstance(events[-1], TurnFinished)
