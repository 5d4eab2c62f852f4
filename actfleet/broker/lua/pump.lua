-- uses: emit
-- Start a parent's waiting children while both caps allow: each takes a slot (a lease
-- scored by its expiry), its turn starts (SubagentStarted's TurnStarted-like event written,
-- first step recorded in the dispatch set). Slots whose lease expired are freed first.
-- KEYS: child queue, parent's slots, fleet slots, pumps, dispatch, seq, stream
-- ARGV: payload (msgpack map): now, maxlen, cap, fleet_cap (0 none), ttl, pump (this
--       parent's member of pumps), turn_prefix, turnstart_prefix, agent_prefix
-- Returns: the members of the started children's first steps.
local queue_key, slots_key, fleet_key, pumps_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local dispatch_key, seq_key, stream_key = KEYS[5], KEYS[6], KEYS[7]
local p = cmsgpack.unpack(ARGV[1])
local now = tonumber(p.now)

redis.call('ZREMRANGEBYSCORE', slots_key, '-inf', now)
redis.call('ZREMRANGEBYSCORE', fleet_key, '-inf', now)
local started = {}
while redis.call('ZCARD', slots_key) < tonumber(p.cap)
    and (tonumber(p.fleet_cap) <= 0 or redis.call('ZCARD', fleet_key) < tonumber(p.fleet_cap)) do
  -- A child turn's keys are derived from its id, popped from the parent's queue.
  local t = redis.call('LPOP', queue_key)
  if not t then break end
  local turn_key = p.turn_prefix .. t
  local st = redis.call('HMGET', turn_key, 'status', 'session_id', 'agent_id')
  if st[1] == 'waiting' then
    redis.call('ZADD', slots_key, now + tonumber(p.ttl), st[3])
    redis.call('ZADD', fleet_key, now + tonumber(p.ttl), st[2] .. '/' .. st[3])
    redis.call('HSET', turn_key, 'status', 'running', 'step_no', 1, 'step_kind', 'model',
               'started_at', p.now)
    redis.call('HSET', p.agent_prefix .. st[2] .. ':' .. st[3], 'active_turn', t)
    local started_key = p.turnstart_prefix .. t
    local event = redis.call('GET', started_key)
    if event then
      local decoded = cmsgpack.unpack(event)
      decoded['ts'] = now
      emit(seq_key, stream_key, p.maxlen, {cmsgpack.pack(decoded)})
    end
    redis.call('DEL', started_key)
    local member = st[2] .. '|' .. st[3] .. '|' .. t .. '|1|model'
    redis.call('ZADD', dispatch_key, now, member)
    started[#started + 1] = member
  end
end
if redis.call('LLEN', queue_key) == 0 then redis.call('SREM', pumps_key, p.pump) end
return started
