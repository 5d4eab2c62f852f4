"""A message a node cannot read never stops it: it is dead-lettered with the reason."""

from __future__ import annotations

import json
from pathlib import Path

import redis

from actfleet.client import Client
from tests.conftest import wait_for, write_replay

JUNK = [b"not json {", b"[1, 2]", b"", b'"a string"', b"\xff\xfe binary"]


def test_undecodable_envelopes_on_the_shared_and_node_queues_are_dead_lettered(
    redis_url: str, fleet_factory, tmp_path: Path
):
    fleet = fleet_factory(redis_url)
    fleet.start("n1")
    r = redis.Redis.from_url(redis_url)
    for queue in ("actfleet.shared", "actfleet.node.n1"):
        for body in JUNK:
            r.lpush(queue, body)
    wait_for(lambda: r.llen("actfleet:deadletters") >= 2 * len(JUNK), 30, "dead letters")
    assert fleet.nodes["n1"].poll() is None, fleet.log("n1")
    letters = [json.loads(x) for x in r.lrange("actfleet:deadletters", 0, -1)]
    assert all(letter["reason"].startswith("unreadable message envelope") for letter in letters)
    replay = write_replay(tmp_path / "r.jsonl", {"code": "print(42)"}, {"text": "canary"})
    client = Client(redis_url)
    handle = client.submit("canary", model=f"replay:{replay}", approval="auto")
    assert client.wait(handle, timeout=60).response == "canary"
