"""Cancelling a session from any machine. The cancel time is recorded (a turn created
before it is cancelled when its next step starts), running steps are told on a pub/sub
channel (their model streams stop, their cells are interrupted), and turns that run no step
(parked on approvals or subagents, children waiting for a slot) are sent a step that ends
them, so every agent reports one Cancelled event."""

from __future__ import annotations

import time
from typing import Any

from actfleet.broker.keys import Keys

# KEYS: cancel time, session agents. ARGV: prefix, now, session id.
_CANCEL = """
local prefix, now, session = ARGV[1], ARGV[2], ARGV[3]
redis.call('SET', KEYS[1], now, 'EX', 86400)
local wake = {}
local function wake_turn(agent, t, phase, fallback)
  local tk = prefix .. ':turn:' .. t
  local st = redis.call('HMGET', tk, 'status', 'step_no', 'step_kind')
  if st[1] == 'parked' or st[1] == 'waiting' then
    if st[1] == 'parked' then
      phase = (st[3] == 'collect') and 'waiting_for_subagents' or 'waiting_for_approval'
    end
    redis.call('HSET', tk, 'status', 'running', 'cancel_phase', phase)
    local member = session .. '|' .. agent .. '|' .. t .. '|' .. (st[2] or '1') .. '|'
                   .. (st[3] or fallback)
    redis.call('ZADD', prefix .. ':dispatch', now, member)
    wake[#wake + 1] = member
  end
end
local agents = redis.call('SMEMBERS', KEYS[2])
for _, agent in ipairs(agents) do
  local active = redis.call('HGET', prefix .. ':agent:' .. session .. ':' .. agent, 'active_turn')
  if active and active ~= '' then wake_turn(agent, active, '', 'model') end
  local waiting = redis.call('LRANGE', prefix .. ':childq:' .. session .. ':' .. agent, 0, -1)
  for _, t in ipairs(waiting) do
    local child = redis.call('HGET', prefix .. ':turn:' .. t, 'agent_id')
    if child then wake_turn(child, t, 'waiting_for_slot', 'model') end
  end
end
redis.call('PUBLISH', prefix .. ':cancels', session)
return wake
"""


def cancel_session(redis: Any, keys: Keys, session_id: str) -> list[str]:
    """Record the cancellation and tell the nodes; returns the dispatch members of the
    steps to send so that idle turns end too. Synchronous: the client's path."""
    woken = redis.eval(
        _CANCEL,
        2,
        keys.cancel(session_id),
        keys.session_agents(session_id),
        keys.prefix,
        time.time(),
        session_id,
    )
    return [w.decode() if isinstance(w, bytes) else w for w in woken]
