-- uses: emit, submit_turn
-- Pump a batch: report its ended items (each once, into the results stream), stop it when
-- its budget is spent or its first items all failed with the same non-transient error,
-- mark items past the item timeout (their sessions are then cancelled), end the queued
-- items of a cancelled or out-of-budget batch, and start queued items while fewer than
-- `concurrency` run. An item parked for an approval holds no slot.
-- KEYS: batch, queue, active, items, results, done, dispatch, sessions index, active batches
-- ARGV: payload (msgpack map: now, maxlen, limit, breaker, templates (key names with {S}
--       for a session id and {T} for a turn id)), batch id
-- Returns: {first steps of the started items, sessions of timed-out items}
local batch_key, queue_key, active_key, items_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local results_key, done_key, dispatch_key, sessions_key, batches_key =
  KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local p = cmsgpack.unpack(ARGV[1])
local batch = ARGV[2]
local now = tonumber(p.now)

local function key(name, s, t)
  local k = p.templates[name]
  if s then k = (string.gsub(k, '{S}', (string.gsub(s, '%%', '%%%%')))) end
  if t then k = (string.gsub(k, '{T}', (string.gsub(t, '%%', '%%%%')))) end
  return k
end

local b = redis.call('HMGET', batch_key, 'status', 'concurrency', 'item_timeout', 'max_cost',
                     'max_tokens', 'cost', 'input_tokens', 'output_tokens')
if not b[1] then
  redis.call('SREM', batches_key, batch)
  return {{}, {}}
end
local status = b[1]

local function item_of(cid)
  local blob = redis.call('HGET', items_key, cid)
  if not blob then return nil end
  return cmsgpack.unpack(blob)
end

local function set_status(new, why)
  status = new
  redis.call('HSET', batch_key, 'status', new, 'error', why)
end

-- One result per item, ever (`done` guards it).
local function report(cid, rstatus, fields)
  if redis.call('HSETNX', done_key, cid, rstatus) == 0 then return false end
  local it = item_of(cid) or {}
  local entry = {'custom_id', cid, 'status', rstatus, 'metadata', it.metadata or '',
                 'session_id', it.session_id or ''}
  for name, value in pairs(fields) do
    entry[#entry + 1] = name
    entry[#entry + 1] = tostring(value)
  end
  redis.call('XADD', results_key, '*', unpack(entry))
  redis.call('HINCRBY', batch_key, 'n_' .. rstatus, 1)
  return true
end

local function breaker(rstatus, kind, err)
  if redis.call('HGET', batch_key, 'breaker') == 'off' then return end
  if rstatus ~= 'failed' or kind ~= 'permanent' then
    redis.call('HSET', batch_key, 'breaker', 'off')
    return
  end
  local first = redis.call('HGET', batch_key, 'breaker_error')
  if not first then
    redis.call('HSET', batch_key, 'breaker_error', err)
    first = err
  end
  if first ~= err then
    redis.call('HSET', batch_key, 'breaker', 'off')
  elseif redis.call('HINCRBY', batch_key, 'breaker_count', 1) >= tonumber(p.breaker)
      and status == 'running' then
    set_status('stopped', 'the first ' .. p.breaker .. ' items all failed with the same error: '
               .. err .. ' (fix the cause, then submit the same file under the same name to go on)')
  end
end

local ENDED = {finished = true, failed = true, cancelled = true}
local FINISHED = {completed = 'completed', max_turns = 'max_turns', rejected = 'rejected',
                  budget = 'budget'}

-- Active items: report the ended, count the running, time out the overdue.
local running, cancel, reported = 0, {}, 0
local active = redis.call('HGETALL', active_key)
local item_timeout = tonumber(b[3] or '0') or 0
for i = 1, #active, 2 do
  local t, cid = active[i], active[i + 1]
  local turn_key = key('turn', nil, t)
  local f = redis.call('HMGET', turn_key, 'status', 'reason', 'response', 'error', 'error_kind',
                       'input_tokens', 'output_tokens', 'requests', 'cost', 'unpriced',
                       'attempts', 'started_at', 'finished_at', 'session_id', 'timed_out',
                       'step_kind')
  local st = f[1]
  if not st or ENDED[st] then
    local rstatus, err = 'failed', f[4] or ''
    if not st then
      err = 'the item\'s turn record is gone (expired or deleted)'
    elseif st == 'finished' then
      rstatus = FINISHED[f[2] or ''] or 'completed'
    elseif st == 'cancelled' then
      rstatus = (f[15] == '1') and 'timeout' or 'cancelled'
      if rstatus == 'timeout' then err = 'the item ran past the item timeout' end
    end
    report(cid, rstatus, {
      response = f[3] or '', error = err, input_tokens = f[6] or 0, output_tokens = f[7] or 0,
      requests = f[8] or 0, cost = f[9] or 0, unpriced = f[10] or 0, attempts = f[11] or 1,
      started_at = f[12] or 0, finished_at = f[13] or p.now, turn_id = t})
    breaker(rstatus, f[5] or '', err)
    redis.call('HDEL', active_key, t)
    reported = reported + 1
  elseif not (st == 'parked' and f[16] == 'execution') then
    running = running + 1
    local started = tonumber(f[12] or '')
    if item_timeout > 0 and started and f[15] ~= '1' and now - started > item_timeout then
      redis.call('HSET', turn_key, 'timed_out', '1')
      cancel[#cancel + 1] = f[14]
    end
  end
end

-- The budget: once spent, no item starts (and running ones start no model step).
local max_cost, max_tokens = tonumber(b[4] or '0') or 0, tonumber(b[5] or '0') or 0
local tokens = (tonumber(b[7] or '0') or 0) + (tonumber(b[8] or '0') or 0)
if status == 'running' and ((max_cost > 0 and (tonumber(b[6] or '0') or 0) >= max_cost)
                            or (max_tokens > 0 and tokens >= max_tokens)) then
  set_status('budget', 'the batch budget is spent (--max-cost ' .. (b[4] or '0') ..
             ', --max-tokens ' .. (b[5] or '0') .. ')')
end

-- A cancelled or out-of-budget batch ends its queued items without running them.
if status == 'cancelled' or status == 'budget' then
  local why = status == 'budget' and 'not started: the batch budget was spent'
              or 'not started: the batch was cancelled'
  for _ = 1, tonumber(p.limit) do
    local cid = redis.call('LPOP', queue_key)
    if not cid then break end
    report(cid, status, {error = why, finished_at = p.now})
  end
end

-- Start queued items while the concurrency allows.
local started = {}
local concurrency = tonumber(b[2] or '1') or 1
while status == 'running' and running < concurrency and #started < tonumber(p.limit) do
  local cid = redis.call('LPOP', queue_key)
  if not cid then break end
  local it = item_of(cid)
  if it then
    local s = it.session_id
    local event = cmsgpack.unpack(it.started)
    event['ts'] = now
    it.started = cmsgpack.pack(event)
    it.now = p.now
    it.maxlen = p.maxlen
    it.fields.created_at = p.now
    local k = {agent = key('agent', s), turn = key('turn', nil, it.turn_id),
               queue = key('queue', s), seq = key('seq', s), stream = key('stream', s),
               sessions = sessions_key, session = key('session', s),
               turnstart = key('turnstart', nil, it.turn_id), dispatch = dispatch_key,
               agents = key('agents', s), history = key('history', s)}
    local verdict = submit_turn(k, it)
    if verdict[1] == 'network' then
      report(cid, 'failed', {error = 'session ' .. s .. ' keeps the kernel network its first '
                                     .. 'turn gave it (' .. verdict[2] .. ')'})
    else
      redis.call('HSET', active_key, it.turn_id, cid)
      running = running + 1
      if verdict[1] == 'started' then started[#started + 1] = it.first end
    end
  end
end

-- Done: nothing queued to start and nothing active.
if redis.call('HLEN', active_key) == 0 then
  if status == 'running' and redis.call('LLEN', queue_key) == 0 then set_status('done', '') end
  if status ~= 'running' then
    redis.call('HSETNX', batch_key, 'finished_at', p.now)
    if redis.call('LLEN', queue_key) == 0 or status == 'stopped' then
      redis.call('SREM', batches_key, batch)
    end
  end
end
return {started, cancel}
