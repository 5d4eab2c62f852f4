-- Hold an agent's runtime lease for a node (taking it over when its holder is dead).
-- KEYS: lease, node's agent set
-- ARGV: holder (`name|boot`), ttl ms, agent member (`session/agent`), key prefix
-- Returns: {'held' | 'acquired', previous holder} or {'other', live holder's name}
local lease_key, node_agents_key = KEYS[1], KEYS[2]
local holder, ttl, member, prefix = ARGV[1], ARGV[2], ARGV[3], ARGV[4]

local current = redis.call('GET', lease_key)
if current == holder then
  redis.call('PEXPIRE', lease_key, ttl)
  return {'held', ''}
end
if current then
  local sep = string.find(current, '|', 1, true)
  local name = string.sub(current, 1, sep - 1)
  -- The holder's heartbeat key is derived from the holder's name, read from the lease.
  if redis.call('GET', prefix .. ':node:' .. name) == string.sub(current, sep + 1) then
    return {'other', name}
  end
end
redis.call('SET', lease_key, holder, 'PX', ttl)
redis.call('SADD', node_agents_key, member)
return {'acquired', current or ''}
