"""Subagents: child agents spawned by a parent's `subagent_task` calls, each its own turn
on the shared queue, started under caps that are leases.

A cap is a sorted set of running children scored by lease expiry: a node renews the score
of each child it runs from its heartbeat, so the slot of a child whose node died frees
within the lease TTL. Children wait in their parent's queue until a slot is free; the
parent's turn is parked (holds no worker) until its last child has reported.
"""

from __future__ import annotations

import json
import time
from typing import Any

from actfleet.broker.events import SubagentStarted, encode
from actfleet.broker.keys import Keys
from actfleet.broker.stream import EMIT_LUA, stamp

# Starts waiting children while both caps allow. KEYS: waitq, slots, fleet slots.
_PUMP = (
    EMIT_LUA
    + """
local prefix, now, ttl = ARGV[1], tonumber(ARGV[3]), tonumber(ARGV[6])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
local started = {}
while redis.call('ZCARD', KEYS[2]) < tonumber(ARGV[4])
    and (tonumber(ARGV[5]) <= 0 or redis.call('ZCARD', KEYS[3]) < tonumber(ARGV[5])) do
  local t = redis.call('LPOP', KEYS[1])
  if not t then break end
  local tk = prefix .. ':turn:' .. t
  local st = redis.call('HMGET', tk, 'status', 'session_id', 'agent_id')
  if st[1] == 'waiting' then
    redis.call('ZADD', KEYS[2], now + ttl, st[3])
    redis.call('ZADD', KEYS[3], now + ttl, st[2] .. '/' .. st[3])
    redis.call('HSET', tk, 'status', 'running', 'step_no', 1, 'step_kind', 'model',
               'started_at', now)
    redis.call('HSET', prefix .. ':agent:' .. st[2] .. ':' .. st[3], 'active_turn', t)
    local sk = prefix .. ':turnstart:' .. t
    local started_event = cmsgpack.unpack(redis.call('GET', sk))
    started_event['ts'] = now
    emit(prefix .. ':seq:' .. st[2], prefix .. ':stream:' .. st[2], ARGV[2],
         {cmsgpack.pack(started_event)}, 1, 1)
    redis.call('DEL', sk)
    local member = st[2] .. '|' .. st[3] .. '|' .. t .. '|1|model'
    redis.call('ZADD', prefix .. ':dispatch', now, member)
    started[#started + 1] = member
  end
end
if redis.call('LLEN', KEYS[1]) == 0 then
  redis.call('SREM', prefix .. ':pumps', ARGV[7])
end
return started
"""
)


def pump_member(session_id: str, parent_agent: str, cap: int) -> str:
    """How a parent with waiting children is named in the set the nodes sweep."""
    return f"{session_id}|{parent_agent}|{cap}"


async def pump(
    redis: Any,
    keys: Keys,
    maxlen: int,
    *,
    session_id: str,
    parent_agent: str,
    cap: int,
    fleet_cap: int,
    ttl: float,
) -> list[str]:
    """Start the parent's waiting children that the caps allow; returns the dispatch members
    of their first steps, for the caller to send."""
    started = await redis.eval(
        _PUMP,
        3,
        keys.child_queue(session_id, parent_agent),
        keys.slots(session_id, parent_agent),
        keys.fleet_slots(),
        keys.prefix,
        maxlen,
        time.time(),
        cap,
        fleet_cap,
        ttl,
        pump_member(session_id, parent_agent, cap),
    )
    return [s.decode() if isinstance(s, bytes) else s for s in started]


async def spawn(
    redis: Any,
    keys: Keys,
    *,
    session_id: str,
    parent_agent: str,
    child_agent: str,
    child_turn: str,
    cap: int,
    fields: dict[str, Any],
    prompt: str,
    call_id: str,
    node: str,
) -> None:
    """Record a child agent and its turn, waiting for a slot. Idempotent per child turn."""
    if await redis.exists(keys.turn(child_turn)):
        return
    started = SubagentStarted(
        session_id=session_id,
        agent_id=child_agent,
        turn_id=child_turn,
        corr_id=child_turn,
        parent_corr_id=call_id,
        node=node,
        subagent_id=child_agent,
        prompt=prompt,
    )
    async with redis.pipeline(transaction=True) as pipe:
        pipe.hset(keys.turn(child_turn), mapping={**fields, "status": "waiting"})
        pipe.set(keys.turn_started(child_turn), encode(stamp(started)))
        pipe.hset(
            keys.agent(session_id, child_agent),
            mapping={
                "parent_agent": parent_agent,
                "slot": keys.slots(session_id, parent_agent),
            },
        )
        pipe.sadd(keys.session_agents(session_id), child_agent)
        pipe.rpush(keys.child_queue(session_id, parent_agent), child_turn)
        pipe.sadd(keys.pumps(), pump_member(session_id, parent_agent, cap))
        await pipe.execute()


def child_outcome(status: str, text: str) -> str:
    """What a finished child reports to its parent's call (JSON, as an execution outcome)."""
    return json.dumps({"status": status, "text": text})
