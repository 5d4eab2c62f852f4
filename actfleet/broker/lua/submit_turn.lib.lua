-- Library (prepended to scripts that submit turns; needs emit).
-- submit_turn(k, p): record a turn; start it when its agent is idle (TurnStarted written,
-- its first step recorded in the dispatch set), else queue it behind the agent's active
-- turn. Idempotent per turn id. The session's keys lose any retention expiry.
-- k: agent, turn, queue (the agent's turns), seq, stream, sessions (index), session,
--    turnstart, dispatch, agents (the session's), history
-- p: turn_id, agent_id, session_id, now, maxlen, started (TurnStarted blob), first (the
--    first step's reference), fields (map), network ('none', or '' for the nodes' own:
--    kept by a new session only)
-- Returns {'started' | 'queued' | 'exists', status}, or {'network', the session's network}
-- (refused, nothing written: a session's network is set by its first turn).
local function submit_turn(k, p)
  local existing = redis.call('HGET', k.turn, 'status')
  if existing then return {'exists', existing} end
  local network = redis.call('HGET', k.session, 'network') or ''
  if redis.call('EXISTS', k.session) == 1 then
    if p.network ~= '' and p.network ~= network then return {'network', network} end
  elseif p.network ~= '' then
    redis.call('HSET', k.session, 'network', p.network)
  end

  for field, value in pairs(p.fields) do redis.call('HSET', k.turn, field, tostring(value)) end
  redis.call('ZADD', k.sessions, p.now, p.session_id)
  redis.call('SADD', k.agents, p.agent_id)
  redis.call('HSETNX', k.session, 'created_at', p.now)
  for _, key in ipairs({k.agent, k.queue, k.seq, k.stream, k.session, k.agents, k.history}) do
    redis.call('PERSIST', key)
  end
  local active = redis.call('HGET', k.agent, 'active_turn')
  if active and active ~= '' then
    redis.call('SET', k.turnstart, p.started)
    redis.call('RPUSH', k.queue, p.turn_id)
    redis.call('HSET', k.turn, 'status', 'queued')
    return {'queued', 'queued'}
  end
  redis.call('HSET', k.agent, 'active_turn', p.turn_id)
  redis.call('HSET', k.turn, 'status', 'running', 'step_no', 1, 'step_kind', 'model',
             'started_at', p.now)
  redis.call('ZADD', k.dispatch, p.now, p.first)
  emit(k.seq, k.stream, p.maxlen, {p.started})
  return {'started', 'running'}
end
