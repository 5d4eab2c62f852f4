-- uses: emit
-- Decide an approval request: the first decision wins; approve and reject must name the
-- sha256 of the arguments the request was made for; an overdue request counts as expired.
-- For a parked turn's request, the turn resumes (its step recorded in the dispatch set)
-- after its last decision, or at once on a refusal. Retrying with the same decision id
-- returns the first answer.
-- KEYS: approval record, pending approvals, session's pending approvals, approval expiry,
--       seq, stream, turn
--       dispatch
-- ARGV: payload (msgpack map): request_id, status (approved, rejected, expired or
--       withdrawn), args_sha256, approver, reason, now, decision_id, decided (event blob),
--       expired (event blob), maxlen, retention, channel
-- Returns: {status, verdict, detail}: verdict '' (recorded), 'resume' (detail: the step to
--          send), 'unknown', 'hash' (detail: the request's sha256), 'decided' (status and
--          detail: who decided).
local record_key, pending_key, session_pending_key, expiry_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local seq_key, stream_key, turn_key, dispatch_key = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local p = cmsgpack.unpack(ARGV[1])

local r = redis.call('HMGET', record_key, 'status', 'args_sha256', 'expires_at', 'approver',
                     'scope', 'dispatch', 'decision_id', 'resumed')
if not r[1] then return {'', 'unknown', ''} end
if r[1] ~= 'pending' then
  if r[7] and r[7] == p.decision_id then
    return {r[1], (r[8] and r[8] ~= '') and 'resume' or '', r[8] or ''}
  end
  return {r[1], 'decided', r[4] or ''}
end
local status, blob = p.status, p.decided
if status == 'approved' or status == 'rejected' then
  if r[2] ~= p.args_sha256 then return {'', 'hash', r[2]} end
  local expires = tonumber(r[3])
  if expires and expires > 0 and tonumber(p.now) >= expires then
    status, blob = 'expired', p.expired
  end
end
redis.call('HSET', record_key, 'status', status, 'approver', p.approver, 'reason', p.reason,
           'decided_at', p.now, 'decision_id', p.decision_id)
redis.call('ZREM', pending_key, p.request_id)
redis.call('ZREM', session_pending_key, p.request_id)
redis.call('ZREM', expiry_key, p.request_id)
if tonumber(p.retention) > 0 then redis.call('EXPIRE', record_key, p.retention) end
emit(seq_key, stream_key, p.maxlen, {blob})
redis.call('PUBLISH', p.channel, p.request_id)
if r[5] == 'step' then
  local left = redis.call('HINCRBY', turn_key, 'waiting', -1)
  if status ~= 'approved' then redis.call('HSET', turn_key, 'rejected', 1) end
  if (status ~= 'approved' or left <= 0) and redis.call('HGET', turn_key, 'status') == 'parked' then
    redis.call('HSET', turn_key, 'status', 'running')
    redis.call('ZADD', dispatch_key, p.now, r[6])
    redis.call('HSET', record_key, 'resumed', r[6])
    return {status, 'resume', r[6]}
  end
end
return {status, '', ''}
