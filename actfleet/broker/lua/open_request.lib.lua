-- Library (prepended to scripts that open approval requests).
-- open_request(record_key, pending_key, session_pending_key, expiry_key, record):
-- write an approval record (a table of fields) as pending and index it.
local function open_request(record_key, pending_key, session_pending_key, expiry_key, record)
  for field, value in pairs(record) do redis.call('HSET', record_key, field, tostring(value)) end
  redis.call('HSET', record_key, 'status', 'pending')
  redis.call('ZADD', pending_key, record.created_at, record.id)
  redis.call('ZADD', session_pending_key, record.created_at, record.id)
  if tonumber(record.expires_at) > 0 then
    redis.call('ZADD', expiry_key, record.expires_at, record.id)
  end
end
