-- Record a child agent and its turn, waiting in its parent's queue for a slot. Idempotent
-- per child turn.
-- KEYS: child turn, child's start event, child agent, session agents, parent's child queue,
--       pumps
-- ARGV: payload (msgpack map): fields (map), started (SubagentStarted blob), child (agent
--       id), child_turn, parent_agent, pump (the parent's member of pumps)
-- Returns: 1 recorded, 0 already recorded
local turn_key, started_key, agent_key, agents_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local queue_key, pumps_key = KEYS[5], KEYS[6]
local p = cmsgpack.unpack(ARGV[1])
if redis.call('EXISTS', turn_key) == 1 then return 0 end
for field, value in pairs(p.fields) do redis.call('HSET', turn_key, field, value) end
redis.call('HSET', turn_key, 'status', 'waiting')
redis.call('SET', started_key, p.started)
redis.call('HSET', agent_key, 'parent_agent', p.parent_agent)
redis.call('SADD', agents_key, p.child)
redis.call('RPUSH', queue_key, p.child_turn)
redis.call('SADD', pumps_key, p.pump)
return 1
