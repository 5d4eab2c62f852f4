"""A Redis restart (appendonly, same port) is a pause for the fleet, not an error."""

from __future__ import annotations

import time
from pathlib import Path

import redis

from actfleet.client import Client
from bench.chaos import Fleet, Marks, RedisServer, cell_code
from tests.conftest import wait_for, write_replay


def test_a_node_running_a_step_survives_a_redis_restart_and_the_turn_finishes(tmp_path: Path):
    """Found by the chaos suite: on the lost connection, kombu cleared the transport's
    client before the consumer's channel had put its unacknowledged message (the running
    step's) back; that raised AttributeError and Celery stopped the node ("Unrecoverable
    error"), so every node running a step exited."""
    server = RedisServer(tmp_path)
    server.start()
    fleet = Fleet(server.url, tmp_path)
    client = Client(server.url)
    try:
        fleet.start(["n1"])
        replay = write_replay(
            tmp_path / "r.jsonl",
            {"code": cell_code("s-restart", 0, 4.0)},
            {"text": "after the restart"},
        )
        marks = Marks(tmp_path / "runtimes")
        handle = client.submit(
            "x", model=f"replay:{replay}", session_id="s-restart", approval="auto"
        )
        wait_for(lambda: marks.started("s-restart", 0), 60, "the cell to start")
        server.stop()
        time.sleep(1)  # Redis is down for a while: the outage is what is tested
        server.start()
        result = client.wait(handle, timeout=60)
        assert (result.status, result.response) == ("finished", "after the restart")
        assert marks.runs("s-restart", 0) == 1
        fleet.check()
        assert fleet.died == [], fleet.log("n1")
        assert fleet.drain() == []
        assert not redis.Redis.from_url(server.url).keys("actfleet:lease:*")
    finally:
        client.close()
        fleet.close()
        server.stop()
