"""A message a node cannot read or run never stops it: it is dead-lettered with the reason,
and the fleet goes on (a canary turn sent after the junk finishes)."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import redis

from actfleet.client import Client
from bench.chaos import envelope, queue_junk
from tests.conftest import cli, wait_for, write_replay


def test_every_kind_of_malformed_message_is_dead_lettered_and_the_node_goes_on(
    redis_url: str, fleet_factory, tmp_path: Path
):
    fleet = fleet_factory(redis_url)
    fleet.start("n1")
    r = redis.Redis.from_url(redis_url)
    kinds = queue_junk("s-x|main|t-x|1|model")
    for queue in ("actfleet.shared", "actfleet.node.n1"):
        for body in kinds.values():
            r.lpush(queue, body)
    expected = 2 * len(kinds)
    wait_for(lambda: r.llen("actfleet:deadletters") >= expected, 90, f"{expected} dead letters")
    assert fleet.nodes["n1"].poll() is None, fleet.log("n1")
    letters = [json.loads(x) for x in r.lrange("actfleet:deadletters", 0, -1)]
    assert len(letters) == expected
    assert all(letter["reason"] and letter["size"] >= 0 for letter in letters)
    assert max(len(letter["preview"]) for letter in letters) <= 300
    reasons = " ".join(letter["reason"] for letter in letters)
    for fragment in (
        "unreadable message envelope",
        "unknown task 'os.system'",
        "not a Celery task message",
        "invalid task message (application/x-python-serialize)",
        "malformed model step message",
        "undecodable message body",
    ):
        assert fragment in reasons

    listed = cli(redis_url, "dead-letters", "--limit", "100", "--json")
    assert [json.loads(line) for line in listed.stdout.splitlines()] == letters
    shown = cli(redis_url, "dead-letters", "-n", "3")
    assert shown.returncode == 0, shown.stderr
    assert "malformed model step message" in shown.stdout

    replay = write_replay(tmp_path / "r.jsonl", {"code": "print(42)"}, {"text": "canary"})
    client = Client(redis_url)
    handle = client.submit("canary", model=f"replay:{replay}", approval="auto")
    assert client.wait(handle, timeout=60).response == "canary"
    assert fleet.nodes["n1"].poll() is None, fleet.log("n1")


def test_junk_on_the_broadcast_channel_is_dead_lettered_and_the_node_goes_on(
    redis_url: str, fleet_factory, tmp_path: Path
):
    fleet = fleet_factory(redis_url)
    fleet.start("n1")
    r = redis.Redis.from_url(redis_url)
    db = redis_url.rsplit("/", 1)[1]
    wait_for(lambda: r.pubsub_numpat() > 0, 30, "the node's remote-control subscription")
    junk = [b"not json {", b"", b"\xff\xfe", b"[" * 100_000, b"[1, 2]", b'{"body": "!!!"}']
    for body in [*junk, envelope(b"\xc1")]:
        assert r.publish(f"/{db}.celery.pidbox", body) == 1
    wait_for(lambda: r.llen("actfleet:deadletters") >= 7, 30, "dead letters")
    reasons = " ".join(json.loads(x)["reason"] for x in r.lrange("actfleet:deadletters", 0, -1))
    # kombu itself drops the first four with a log line only; they are dead-lettered too.
    assert reasons.count("unreadable broadcast message") == 6, reasons
    assert "undecodable message body" in reasons
    replay = write_replay(tmp_path / "r.jsonl", {"text": "canary"})
    client = Client(redis_url)
    handle = client.submit("canary", model=f"replay:{replay}", approval="auto")
    assert client.wait(handle, timeout=60).response == "canary"
    assert fleet.nodes["n1"].poll() is None, fleet.log("n1")


def test_junk_and_forged_cancels_on_the_reply_channels_change_nothing(
    redis_url: str, fleet_factory, tmp_path: Path
):
    fleet = fleet_factory(redis_url)
    fleet.start("n1")
    r = redis.Redis.from_url(redis_url)
    replay = write_replay(
        tmp_path / "r.jsonl",
        {"code": "import time; time.sleep(2); print('slept')"},
        {"text": "done"},
    )
    client = Client(redis_url)
    handle = client.submit("sleep", model=f"replay:{replay}", approval="auto")
    wait_for(lambda: _seen(r, handle.session_id, b"CodeAction"), 30, "the cell to start")
    for channel in ("actfleet:decided", "actfleet:cancels"):
        r.publish(channel, "../not an id")
    r.publish("actfleet:cancels", handle.session_id)
    result = client.wait(handle, timeout=60)
    assert (result.status, result.response) == ("finished", "done")
    reasons = [json.loads(x)["reason"] for x in r.lrange("actfleet:deadletters", 0, -1)]
    assert sorted(reasons) == [
        "not a valid id on the actfleet:cancels channel",
        "not a valid id on the actfleet:decided channel",
    ]


def test_binary_junk_on_the_reply_channels_is_dead_lettered_and_the_node_keeps_listening(
    redis_url: str, fleet_factory
):
    fleet = fleet_factory(redis_url)
    fleet.start("n1")
    r = redis.Redis.from_url(redis_url)
    wait_for(lambda: r.pubsub_numsub("actfleet:decided")[0][1] == 1, 30, "the listener")
    for channel in ("actfleet:decided", "actfleet:cancels"):
        for body in (b"\xff\xfe", b"", b"../x"):
            r.publish(channel, body)
    wait_for(lambda: r.llen("actfleet:deadletters") >= 6, 30, "6 dead letters")
    sources = sorted(json.loads(x)["source"] for x in r.lrange("actfleet:deadletters", 0, -1))
    assert sources == ["actfleet:cancels"] * 3 + ["actfleet:decided"] * 3
    assert "resubscribing" not in fleet.log("n1")


def test_junk_in_the_swept_sets_is_dead_lettered_once_and_takeover_goes_on(
    redis_url: str, fleet_factory
):
    """Every node sweeps the dispatch and pump sets and the node registry: a junk member
    is dead-lettered once, and a member that is no text does not stop the takeover of a
    dead node."""
    fleet = fleet_factory(redis_url)
    for name in ("a", "b", "c"):
        fleet.start(name)
    r = redis.Redis.from_url(redis_url)
    dispatch = [f"junk-{i}".encode() for i in range(20)]
    r.zadd("actfleet:dispatch", dict.fromkeys(dispatch, 0))
    r.sadd("actfleet:pumps", *[f"pump-junk-{i}" for i in range(10)])
    r.sadd("actfleet:nodes", b"\xff\xfe node")
    fleet.kill("a")
    wait_for(lambda: not r.sismember("actfleet:nodes", "a"), 30, "node a to be taken over")
    wait_for(lambda: r.llen("actfleet:deadletters") >= 31, 30, "31 dead letters")
    time.sleep(2)  # a few more sweeps of both nodes: nothing is dead-lettered twice
    sources = Counter(json.loads(x)["source"] for x in r.lrange("actfleet:deadletters", 0, -1))
    assert sources == {"actfleet:dispatch": 20, "actfleet:pumps": 10, "actfleet:nodes": 1}
    assert r.zcard("actfleet:dispatch") == r.scard("actfleet:pumps") == 0


def _seen(r: redis.Redis, session_id: str, event_type: bytes) -> bool:
    return any(
        event_type in str(fields).encode()
        for _, fields in r.xrange(f"actfleet:stream:{session_id}")
    )
