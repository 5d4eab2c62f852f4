-- Create or update a batch's record and add the items not yet in it, queued in order.
-- Submitting again (the same name) adds only missing items and sets the batch running.
-- KEYS: batch, items, queue, batches index, active batches
-- ARGV: payload (msgpack map: now, record (map of fields)), then custom_id, item pairs
-- Returns: how many items were new.
local batch_key, items_key, queue_key, index_key, active_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local p = cmsgpack.unpack(ARGV[1])

redis.call('HSETNX', batch_key, 'created_at', p.now)
for field, value in pairs(p.record) do redis.call('HSET', batch_key, field, value) end
redis.call('HSET', batch_key, 'status', 'running')
redis.call('HDEL', batch_key, 'error', 'finished_at', 'breaker', 'breaker_error', 'breaker_count')
local added = 0
for i = 2, #ARGV, 2 do
  if redis.call('HSETNX', items_key, ARGV[i], ARGV[i + 1]) == 1 then
    redis.call('RPUSH', queue_key, ARGV[i])
    added = added + 1
  end
end
redis.call('HSET', batch_key, 'total', redis.call('HLEN', items_key))
redis.call('ZADD', index_key, 'NX', redis.call('HGET', batch_key, 'created_at'), p.record.id)
redis.call('SADD', active_key, p.record.id)
return added
