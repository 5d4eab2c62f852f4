"""Ids a user gives are checked against one pattern before anything is written."""

from __future__ import annotations

import pytest
import redis

from actfleet.broker.ids import BadId
from actfleet.broker.records import BadRecord, StepRef
from actfleet.client import Client


@pytest.mark.parametrize("session_id", ["a|b", "a/b", "..", "../x", "a b", "x" * 200, ""])
def test_a_session_id_outside_the_pattern_is_refused_at_submit_and_nothing_is_written(
    redis_url: str, session_id: str
):
    client = Client(redis_url)
    with pytest.raises(BadId, match="is not a valid id: use letters, digits"):
        client.submit("hi", model="test", session_id=session_id, approval="auto")
    assert redis.Redis.from_url(redis_url).dbsize() == 0


@pytest.mark.parametrize(
    "message",
    ["s|main|t|1", "s/x|main|t|1|model", "s|main|t|0|model", "s|main|t|1|shell", "..|a|t|1|model"],
)
def test_a_step_reference_a_node_cannot_trust_is_refused(message: str):
    with pytest.raises(BadRecord):
        StepRef.decode(message)
