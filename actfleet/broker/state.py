"""Session, turn and step state, and the agents' message histories, in Redis.

Each state change that must be atomic is one Lua script: submitting a turn (and starting
it when the agent is idle), claiming a step, committing a step (history, events, turn
fields and, at a turn's end, starting the agent's next queued turn), taking a lease.
"""

from __future__ import annotations

import time
from typing import Any

from actfleet.broker.approvals import OPEN_LUA
from actfleet.broker.events import Event, encode
from actfleet.broker.keys import Keys
from actfleet.broker.stream import EMIT_LUA, stamp

_SUBMIT = (
    EMIT_LUA
    + """
redis.call('HSET', KEYS[2], unpack(ARGV, 7))
redis.call('ZADD', KEYS[6], ARGV[4], ARGV[5])
redis.call('SADD', KEYS[10], ARGV[6])
redis.call('HSETNX', KEYS[7], 'created_at', ARGV[4])
local active = redis.call('HGET', KEYS[1], 'active_turn')
if active and active ~= '' then
  redis.call('SET', KEYS[8], ARGV[3])
  redis.call('RPUSH', KEYS[3], ARGV[1])
  redis.call('HSET', KEYS[2], 'status', 'queued')
  return 'queued'
end
redis.call('HSET', KEYS[1], 'active_turn', ARGV[1])
redis.call('HSET', KEYS[2], 'status', 'running', 'step_no', 1, 'step_kind', 'model')
redis.call('ZADD', KEYS[9], ARGV[4], ARGV[5] .. '|' .. ARGV[6] .. '|' .. ARGV[1] .. '|1|model')
emit(KEYS[4], KEYS[5], ARGV[2], {ARGV[3]}, 1, 1)
return 'started'
"""
)

_CLAIM = """
local st = redis.call('HMGET', KEYS[1], 'state', 'owner_node', 'owner_boot')
if st[1] == 'done' then return {'done', ''} end
local prev = ''
if st[2] then
  if st[2] == ARGV[1] and st[3] == ARGV[2] then return {'mine', ''} end
  if redis.call('GET', ARGV[3] .. ':node:' .. st[2]) == st[3] then return {'busy', st[2]} end
  prev = st[2]
end
redis.call('HSET', KEYS[1], 'state', 'running', 'owner_node', ARGV[1], 'owner_boot', ARGV[2])
redis.call('ZREM', KEYS[2], ARGV[4])
return {'ok', prev}
"""

_COMMIT = (
    EMIT_LUA
    + OPEN_LUA
    + """
if redis.call('HGET', KEYS[1], 'state') == 'done' then return {0, '', ''} end
redis.call('HSET', KEYS[1], 'state', 'done')
local i = 3
local n = tonumber(ARGV[i])
for j = 1, n do redis.call('RPUSH', KEYS[3], ARGV[i + j]) end
i = i + n + 1
n = tonumber(ARGV[i])
emit(KEYS[4], KEYS[5], ARGV[2], ARGV, i + 1, i + n)
i = i + n + 1
n = tonumber(ARGV[i])
if n > 0 then redis.call('HSET', KEYS[2], unpack(ARGV, i + 1, i + n)) end
i = i + n + 1
n = tonumber(ARGV[i])
for j = 1, n do open_request(ARGV[1], ARGV[i + j]) end
i = i + n + 1
local nxt = ''
if ARGV[i] == '1' then
  nxt = redis.call('LPOP', KEYS[7])
  if nxt then
    local tk = ARGV[1] .. ':turn:' .. nxt
    redis.call('HSET', KEYS[6], 'active_turn', nxt)
    redis.call('HSET', tk, 'status', 'running', 'step_no', 1, 'step_kind', 'model')
    local sk = ARGV[1] .. ':turnstart:' .. nxt
    emit(KEYS[4], KEYS[5], ARGV[2], {redis.call('GET', sk)}, 1, 1)
    redis.call('DEL', sk)
  else
    nxt = ''
    redis.call('HSET', KEYS[6], 'active_turn', '')
  end
end
local resume = ''
if ARGV[i] == '1' and ARGV[i + 1] ~= '' then
  -- A child's turn ended: free its slots, report to the parent's call, add its usage,
  -- and resume the parent when this was its last child.
  local c = redis.call('HMGET', KEYS[2], 'parent_turn', 'parent_call', 'parent_results',
                       'parent_dispatch', 'session_id', 'agent_id', 'input_tokens',
                       'output_tokens', 'requests', 'parent_agent')
  redis.call('ZREM', ARGV[1] .. ':slots:' .. c[5] .. ':' .. c[10], c[6])
  redis.call('ZREM', ARGV[1] .. ':slots', c[5] .. '/' .. c[6])
  redis.call('HSET', c[3], c[2], ARGV[i + 1])
  emit(KEYS[4], KEYS[5], ARGV[2], ARGV, i + 2, i + 2)
  local pt = ARGV[1] .. ':turn:' .. c[1]
  redis.call('HINCRBY', pt, 'input_tokens', tonumber(c[7] or '0'))
  redis.call('HINCRBY', pt, 'output_tokens', tonumber(c[8] or '0'))
  redis.call('HINCRBY', pt, 'requests', tonumber(c[9] or '0'))
  local left = redis.call('HINCRBY', pt, 'waiting', -1)
  if left <= 0 and redis.call('HGET', pt, 'status') == 'parked' then
    redis.call('HSET', pt, 'status', 'running')
    redis.call('ZADD', ARGV[1] .. ':dispatch', ARGV[i + 3], c[4])
    resume = c[4]
  end
end
return {1, nxt, resume}
"""
)

_LEASE = """
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {'held', ''}
end
if cur then
  local sep = string.find(cur, '|', 1, true)
  if redis.call('GET', ARGV[4] .. ':node:' .. string.sub(cur, 1, sep - 1))
      == string.sub(cur, sep + 1) then
    return {'other', string.sub(cur, 1, sep - 1)}
  end
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('SADD', KEYS[2], ARGV[3])
return {'acquired', cur or ''}
"""


def text(value: Any) -> str:
    """A Redis reply as str."""
    return value.decode() if isinstance(value, bytes) else str(value)


def step_id(turn_id: str, step_no: int, kind: str) -> str:
    return f"{turn_id}:{step_no}:{kind}"


def submit_turn(
    redis: Any,
    keys: Keys,
    maxlen: int,
    *,
    turn_id: str,
    started: Event,
    now: float,
    fields: dict[str, Any],
) -> str:
    """Record a turn; start it (emitting `started`) when its agent is idle, else queue it.
    Returns "started" or "queued". Synchronous: the client's path."""
    flat = [x for kv in fields.items() for x in kv]
    s, a = started.session_id, started.agent_id
    result = redis.eval(
        _SUBMIT,
        10,
        keys.agent(s, a),
        keys.turn(turn_id),
        keys.turn_queue(s, a),
        keys.seq(s),
        keys.stream(s),
        keys.sessions(),
        keys.session(s),
        keys.turn_started(turn_id),
        keys.dispatch(),
        keys.session_agents(s),
        turn_id,
        maxlen,
        encode(stamp(started)),
        now,
        s,
        a,
        *flat,
    )
    return text(result)


async def claim_step(
    redis: Any, keys: Keys, sid: str, node: str, boot: str, dispatch: str = ""
) -> tuple[str, str]:
    """Take a step to run (and drop its `dispatch` entry). Returns (verdict, previous owner):
    "ok" (with the name of a dead node that had started it, if any), "done", "busy" (a live
    node runs it) or "mine"."""
    verdict, prev = await redis.eval(
        _CLAIM, 2, keys.step(sid), keys.dispatch(), node, boot, keys.prefix, dispatch
    )
    return text(verdict), text(prev)


async def commit_step(
    redis: Any,
    keys: Keys,
    maxlen: int,
    *,
    sid: str,
    session_id: str,
    agent_id: str,
    turn_id: str,
    history: list[bytes],
    events: list[Event],
    turn_fields: dict[str, Any],
    terminal: bool,
    requests: list[str] = (),  # type: ignore[assignment]
    child_report: tuple[str, Event] | None = None,
) -> tuple[bool, str, str]:
    """Record a step done with all its effects, atomically: history, events, turn fields,
    approval requests (JSON records) to open; at a child's end, `child_report` (its outcome
    for the parent's call, its SubagentFinished event). Returns (committed, next turn id,
    parent resume): not committed when it was already done; at a turn's end, the agent's
    next queued turn (already started) or ""; the dispatch member of the parent's step when
    this child was the last it waited for, or ""."""
    flat = [x for kv in turn_fields.items() for x in kv]
    blobs = [encode(stamp(e)) for e in events]
    report: list[Any] = ["", b"", 0]
    if child_report is not None:
        report = [child_report[0], encode(stamp(child_report[1])), time.time()]
    done, nxt, resume = await redis.eval(
        _COMMIT,
        7,
        keys.step(sid),
        keys.turn(turn_id),
        keys.history(session_id, agent_id),
        keys.seq(session_id),
        keys.stream(session_id),
        keys.agent(session_id, agent_id),
        keys.turn_queue(session_id, agent_id),
        keys.prefix,
        maxlen,
        len(history),
        *history,
        len(blobs),
        *blobs,
        len(flat),
        *flat,
        len(requests),
        *requests,
        "1" if terminal else "0",
        *report,
    )
    return bool(done), text(nxt), text(resume)


async def take_lease(
    redis: Any, keys: Keys, *, session_id: str, agent_id: str, node: str, boot: str, ttl: float
) -> tuple[str, str]:
    """Hold the agent's runtime lease. Returns ("held" | "acquired", previous holder) or
    ("other", live holder's node name)."""
    verdict, other = await redis.eval(
        _LEASE,
        2,
        keys.lease(session_id, agent_id),
        keys.node_agents(node),
        f"{node}|{boot}",
        int(ttl * 1000),
        f"{session_id}/{agent_id}",
        keys.prefix,
    )
    return text(verdict), text(other)


def lease_holder(value: Any) -> str:
    """The node name in a lease value (`name|boot`), or "" for none."""
    return text(value).split("|", 1)[0] if value else ""


def route(keys: Keys, lease_value: Any) -> str:
    """The queue for an agent's next step: its runtime's node, or the shared queue."""
    holder = lease_holder(lease_value)
    return keys.node_queue(holder) if holder else keys.shared_queue()
