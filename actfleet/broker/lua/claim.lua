-- Claim a step to run. Refused (and changing nothing) unless it is its turn's current
-- step: the turn running, step number and kind matching, and for an execution step no
-- approval request still pending. A step runs at most once at a time: a step owned by a
-- live node is busy; one whose owner died is taken over (the dead owner is returned).
-- KEYS: step, turn, cancel time, dispatch
-- ARGV: node, boot, step_no, kind, dispatch member, now, key prefix
-- Returns: {verdict, detail, turn fields (flat list)}; verdict 'ok' (detail: the dead
-- previous owner or ''), 'cancel' (claimed; the session was cancelled after the turn was
-- created), 'mine', 'busy' (detail: the owner), 'done', or 'refused' (detail: why).
local step_key, turn_key, cancel_key, dispatch_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local node, boot, step_no, kind, member, now, prefix =
  ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]

local step = redis.call('HMGET', step_key, 'state', 'owner_node', 'owner_boot')
if step[1] == 'done' then return {'done', '', {}} end
local turn = redis.call('HMGET', turn_key, 'status', 'step_no', 'step_kind', 'created_at',
                        'waiting', 'rejected', 'cancel_phase')
local status = turn[1]
if not status then return {'refused', 'the turn does not exist', {}} end
if status ~= 'running' then return {'refused', 'the turn is ' .. status, {}} end
if turn[2] ~= step_no or turn[3] ~= kind then
  return {'refused', 'not the current step (the turn is at ' .. tostring(turn[2]) .. ':'
          .. tostring(turn[3]) .. ')', {}}
end
local cancelled_at = redis.call('GET', cancel_key)
local cancelled = cancelled_at and tonumber(cancelled_at) >= tonumber(turn[4] or '0')
if kind == 'execution' and tonumber(turn[5] or '0') > 0 and turn[6] ~= '1' and not cancelled then
  return {'refused', tostring(turn[5]) .. ' approval request(s) still pending', {}}
end
local previous = ''
if step[2] then
  if step[2] == node and step[3] == boot then return {'mine', '', {}} end
  -- The owner's heartbeat key is derived from the owner's name, read from the step record.
  if redis.call('GET', prefix .. ':node:' .. step[2]) == step[3] then
    return {'busy', step[2], {}}
  end
  previous = step[2]
end
redis.call('HSET', step_key, 'state', 'running', 'owner_node', node, 'owner_boot', boot)
redis.call('ZADD', dispatch_key, 'XX', now, member)
local verdict = cancelled and 'cancel' or 'ok'
return {verdict, previous, redis.call('HGETALL', turn_key)}
