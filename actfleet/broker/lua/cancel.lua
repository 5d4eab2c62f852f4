-- Cancel a session: record when (a turn created before then is cancelled at its next
-- step), tell the nodes (their running steps stop), and wake every turn that runs no step
-- (parked on approvals or subagents, children waiting for a slot) with a step that ends it.
-- KEYS: cancel time, session agents, dispatch
-- ARGV: now, session id, channel, retention of the cancel mark (seconds), agent_prefix,
--       turn_prefix, child_queue_prefix
-- Returns: the members of the steps to send.
local cancel_key, agents_key, dispatch_key = KEYS[1], KEYS[2], KEYS[3]
local now, session, channel, ttl = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local agent_prefix, turn_prefix, child_queue_prefix = ARGV[5], ARGV[6], ARGV[7]

redis.call('SET', cancel_key, now, 'EX', ttl)
local wake = {}
local function wake_turn(agent, t, phase)
  local turn_key = turn_prefix .. t
  local st = redis.call('HMGET', turn_key, 'status', 'step_no', 'step_kind')
  if st[1] == 'parked' or st[1] == 'waiting' then
    if st[1] == 'parked' then
      phase = (st[3] == 'collect') and 'waiting_for_subagents' or 'waiting_for_approval'
    end
    local step_no, kind = st[2] or '1', st[3] or 'model'
    if st[1] == 'waiting' then step_no, kind = '1', 'model' end
    redis.call('HSET', turn_key, 'status', 'running', 'cancel_phase', phase,
               'step_no', step_no, 'step_kind', kind)
    local member = session .. '|' .. agent .. '|' .. t .. '|' .. step_no .. '|' .. kind
    redis.call('ZADD', dispatch_key, now, member)
    wake[#wake + 1] = member
  end
end
-- The agents' records, active turns and child queues are derived from the session's
-- agent ids: a cancel reaches every agent, whichever turn it is in.
for _, agent in ipairs(redis.call('SMEMBERS', agents_key)) do
  local active = redis.call('HGET', agent_prefix .. session .. ':' .. agent, 'active_turn')
  if active and active ~= '' then wake_turn(agent, active, '') end
  for _, t in ipairs(redis.call('LRANGE', child_queue_prefix .. session .. ':' .. agent, 0, -1)) do
    local child = redis.call('HGET', turn_prefix .. t, 'agent_id')
    if child then wake_turn(child, t, 'waiting_for_slot') end
  end
end
redis.call('PUBLISH', channel, session)
return wake
