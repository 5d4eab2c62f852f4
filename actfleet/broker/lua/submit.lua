-- uses: emit
-- Submit a turn: record it; start it when its agent is idle (TurnStarted written, its first
-- step recorded in the dispatch set), else queue it behind the agent's active turn.
-- Idempotent per turn id. The session's keys lose any retention expiry.
-- KEYS: agent, turn, turn queue, seq, stream, sessions index, session, turn-start event,
--       dispatch, session agents, history
-- ARGV: payload (msgpack map): turn_id, agent_id, session_id, now, maxlen,
--       started (TurnStarted blob), first (the first step's reference), fields (map),
--       network ('none', or '' for the nodes' own: kept by a new session only)
-- Returns: {'started' | 'queued' | 'exists', status}, or {'network', the session's network}
--          (refused, nothing written: a session's network is set by its first turn)
local agent_key, turn_key, queue_key, seq_key, stream_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local sessions_key, session_key, turnstart_key, dispatch_key = KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local agents_key, history_key = KEYS[10], KEYS[11]
local p = cmsgpack.unpack(ARGV[1])

local existing = redis.call('HGET', turn_key, 'status')
if existing then return {'exists', existing} end
local network = redis.call('HGET', session_key, 'network') or ''
if redis.call('EXISTS', session_key) == 1 then
  if p.network ~= '' and p.network ~= network then return {'network', network} end
elseif p.network ~= '' then
  redis.call('HSET', session_key, 'network', p.network)
end

for field, value in pairs(p.fields) do redis.call('HSET', turn_key, field, tostring(value)) end
redis.call('ZADD', sessions_key, p.now, p.session_id)
redis.call('SADD', agents_key, p.agent_id)
redis.call('HSETNX', session_key, 'created_at', p.now)
for _, key in ipairs({agent_key, queue_key, seq_key, stream_key, session_key, agents_key,
                      history_key}) do
  redis.call('PERSIST', key)
end
local active = redis.call('HGET', agent_key, 'active_turn')
if active and active ~= '' then
  redis.call('SET', turnstart_key, p.started)
  redis.call('RPUSH', queue_key, p.turn_id)
  redis.call('HSET', turn_key, 'status', 'queued')
  return {'queued', 'queued'}
end
redis.call('HSET', agent_key, 'active_turn', p.turn_id)
redis.call('HSET', turn_key, 'status', 'running', 'step_no', 1, 'step_kind', 'model',
           'started_at', p.now)
redis.call('ZADD', dispatch_key, p.now, p.first)
emit(seq_key, stream_key, p.maxlen, {p.started})
return {'started', 'running'}
