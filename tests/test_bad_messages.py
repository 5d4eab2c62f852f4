"""A message a node cannot read or run never stops it: it is dead-lettered with the reason,
and the fleet goes on (a canary turn sent after the junk finishes)."""

from __future__ import annotations

import base64
import json
import pickle
import uuid
from pathlib import Path

import msgpack
import redis

from actfleet.client import Client
from tests.conftest import cli, wait_for, write_replay


def envelope(
    body: bytes,
    *,
    task: object = "actfleet.model_step",
    content_type: str = "application/x-msgpack",
    headers: object = None,
    encode_body: bool = True,
    properties: object = None,
) -> bytes:
    """A Celery message as kombu's Redis transport stores it, with one part made wrong."""
    tag = str(uuid.uuid4())
    return json.dumps(
        {
            "body": base64.b64encode(body).decode() if encode_body else body.decode(),
            "content-encoding": "binary",
            "content-type": content_type,
            "headers": headers if headers is not None else {"task": task, "id": tag, "lang": "py"},
            "properties": properties
            if properties is not None
            else {
                "delivery_tag": tag,
                "delivery_info": {"exchange": "", "routing_key": "x"},
                "body_encoding": "base64",
                "priority": 0,
            },
        }
    ).encode()


def step_body(args: list, kwargs: dict | None = None) -> bytes:
    return msgpack.packb([args, kwargs or {}, {}])


def junk(ref: str) -> dict[str, bytes]:
    """Malformed messages by kind, each one a node could meet on a queue."""
    return {
        "not json": b"not json {",
        "a json list": b"[1, 2]",
        "a json string": b'"a string"',
        "empty": b"",
        "binary": b"\xff\xfe binary",
        "no properties": b'{"body": "!!!"}',
        "properties not an object": envelope(step_body([ref]), properties=[1]),
        "body not base64": envelope(b"!!! not base64 !!!", encode_body=False),
        "msgpack of the wrong shape": envelope(msgpack.packb("just a string")),
        "body not msgpack": envelope(b"\xc1\xc1\xc1"),
        "json content": envelope(b'[["x"], {}, {}]', content_type="application/json"),
        "pickle content": envelope(
            pickle.dumps([["x"], {}, {}]), content_type="application/x-python-serialize"
        ),
        "unknown task": envelope(step_body([ref]), task="os.system"),
        "headers without a task": envelope(step_body([ref]), headers={"id": "1"}),
        "headers not an object": envelope(step_body([ref]), headers="x"),
        "two arguments": envelope(step_body([ref, ref])),
        "keyword arguments": envelope(step_body([], {"ref": ref})),
        "argument of the wrong type": envelope(step_body([123])),
        "argument JSON cannot hold": envelope(step_body([{b"bytes key": 1}])),
        "keyword argument named task": envelope(step_body([ref], {"task": 1})),
        "malformed step reference": envelope(step_body(["a|b"])),
        "step reference with a path": envelope(step_body(["../..|main|t|1|model"])),
        "kind other than the task's": envelope(step_body([ref.replace("model", "collect")])),
        "20 MB": envelope(b"\x00" * 20_000_000),
    }


def test_every_kind_of_malformed_message_is_dead_lettered_and_the_node_goes_on(
    redis_url: str, fleet_factory, tmp_path: Path
):
    fleet = fleet_factory(redis_url)
    fleet.start("n1")
    r = redis.Redis.from_url(redis_url)
    kinds = junk("s-x|main|t-x|1|model")
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
    for body in (b"not json {", b"[1, 2]", b'{"body": "!!!"}', envelope(b"\xc1")):
        assert r.publish(f"/{db}.celery.pidbox", body) == 1
    wait_for(lambda: r.llen("actfleet:deadletters") >= 3, 30, "dead letters")
    reasons = " ".join(json.loads(x)["reason"] for x in r.lrange("actfleet:deadletters", 0, -1))
    assert reasons.count("unreadable broadcast message") == 2, reasons
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


def _seen(r: redis.Redis, session_id: str, event_type: bytes) -> bool:
    return any(
        event_type in str(fields).encode()
        for _, fields in r.xrange(f"actfleet:stream:{session_id}")
    )
