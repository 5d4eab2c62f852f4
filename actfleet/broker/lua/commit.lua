-- uses: emit, open_request
-- Commit a step: record it done together with all its effects, atomically. Effects: the
-- agent's new history messages, events, turn fields, approval requests to open, the next
-- step recorded in the dispatch set; at a turn's end, the agent's next queued turn started
-- (or, with none, the agent's keys given the retention expiry), for a main agent its
-- turn's usage added to the session's totals, for a batch item (or its subagents) what the
-- step used added to the batch's totals, and, for a subagent, its report to the
-- parent's call (slots freed, usage added, the parent resumed after its last child). A step already done changes nothing and returns the steps it sent, so a
-- retried commit sends them again (sends are idempotent); a step of an ended turn is stale.
-- KEYS: step, turn, history, seq, stream, agent, turn queue, dispatch, sessions index,
--       session, session agents, results to drop ('' none), parent turn ('' none),
--       parent results, parent slots, fleet slots, pending approvals, approval expiry,
--       session's pending approvals, then one approval record key per request
-- ARGV: payload (msgpack map): session_id, agent_id, member (this step), next (member or
--       ''), terminal (bool), is_main (bool), now, maxlen, step_ttl, retention (seconds,
--       0 none), history (blobs), events (blobs), fields (map), requests (list of maps),
--       report (map or nil: call_id, outcome, finished (blob), child, resume (member)),
--       turn_prefix and turnstart_prefix (key names of a turn and its start event, less
--       the turn id), batch (the batch record's key, or '')
-- Returns: {1 committed | 0 already done | -1 stale (turn ended), sent members joined by ' '}
local step_key, turn_key, history_key, seq_key, stream_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local agent_key, queue_key, dispatch_key, sessions_key = KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local session_key, agents_key, results_key = KEYS[10], KEYS[11], KEYS[12]
local parent_turn_key, parent_results_key, parent_slots_key, fleet_slots_key =
  KEYS[13], KEYS[14], KEYS[15], KEYS[16]
local pending_key, expiry_key, session_pending_key = KEYS[17], KEYS[18], KEYS[19]
local p = cmsgpack.unpack(ARGV[1])

-- A turn's usage fields added to a hash (a parent turn's, the session's). The cost is
-- passed on as the string it came as: HINCRBYFLOAT reads it exactly.
local function add_usage(key, fields)
  for _, name in ipairs({'input_tokens', 'output_tokens', 'requests', 'unpriced'}) do
    redis.call('HINCRBY', key, name, tonumber(fields[name] or '0'))
  end
  redis.call('HINCRBYFLOAT', key, 'cost', fields.cost or '0')
end

local step = redis.call('HMGET', step_key, 'state', 'sends')
if step[1] == 'done' then return {0, step[2] or ''} end
local status = redis.call('HGET', turn_key, 'status')
if status == 'finished' or status == 'failed' or status == 'cancelled' then return {-1, ''} end

for _, blob in ipairs(p.history) do redis.call('RPUSH', history_key, blob) end
emit(seq_key, stream_key, p.maxlen, p.events)
-- What the step used, added to its batch (what the batch's budget is checked against):
-- the turn's usage fields less what the turn had before this commit.
if p.batch ~= '' then
  local names = {'input_tokens', 'output_tokens', 'requests', 'unpriced', 'cost'}
  local before = redis.call('HMGET', turn_key, unpack(names))
  for i, name in ipairs(names) do
    local total = tonumber(p.fields[name] or '')
    local used = total and total - (tonumber(before[i] or '0') or 0)
    if used and used > 0 then
      if name == 'cost' then
        redis.call('HINCRBYFLOAT', p.batch, name, string.format('%.17g', used))
      else
        redis.call('HINCRBY', p.batch, name, used)
      end
    end
  end
end
for field, value in pairs(p.fields) do redis.call('HSET', turn_key, field, value) end
for i, record in ipairs(p.requests) do
  open_request(KEYS[19 + i], pending_key, session_pending_key, expiry_key, record)
end
if results_key ~= '' then redis.call('DEL', results_key) end

local sends = {}
redis.call('ZREM', dispatch_key, p.member)
if p.next ~= '' then
  redis.call('ZADD', dispatch_key, p.now, p.next)
  sends[#sends + 1] = p.next
end

if p.terminal then
  redis.call('ZADD', sessions_key, p.now, p.session_id)
  if p.is_main then add_usage(session_key, p.fields) end
  local retention = tonumber(p.retention)
  if retention > 0 then redis.call('EXPIRE', turn_key, retention) end
  -- The next queued turn's keys are derived from its id, popped from the agent's queue.
  local nxt = redis.call('LPOP', queue_key)
  if nxt then
    local next_turn_key = p.turn_prefix .. nxt
    local started_key = p.turnstart_prefix .. nxt
    redis.call('HSET', agent_key, 'active_turn', nxt)
    redis.call('HSET', next_turn_key, 'status', 'running', 'step_no', 1, 'step_kind', 'model',
               'started_at', p.now)
    local started = redis.call('GET', started_key)
    if started then emit(seq_key, stream_key, p.maxlen, {started}) end
    redis.call('DEL', started_key)
    local first = p.session_id .. '|' .. p.agent_id .. '|' .. nxt .. '|1|model'
    redis.call('ZADD', dispatch_key, p.now, first)
    sends[#sends + 1] = first
  else
    redis.call('HSET', agent_key, 'active_turn', '')
    if retention > 0 then
      local idle = {agent_key, history_key, queue_key}
      if p.is_main then
        idle = {agent_key, history_key, queue_key, seq_key, stream_key, session_key, agents_key}
      end
      for _, key in ipairs(idle) do redis.call('EXPIRE', key, retention) end
    end
  end
  local r = p.report
  if r then
    redis.call('ZREM', parent_slots_key, r.child)
    redis.call('ZREM', fleet_slots_key, p.session_id .. '/' .. r.child)
    redis.call('HSET', parent_results_key, r.call_id, r.outcome)
    emit(seq_key, stream_key, p.maxlen, {r.finished})
    add_usage(parent_turn_key, p.fields)
    local left = redis.call('HINCRBY', parent_turn_key, 'waiting', -1)
    if left <= 0 and redis.call('HGET', parent_turn_key, 'status') == 'parked' then
      redis.call('HSET', parent_turn_key, 'status', 'running')
      redis.call('ZADD', dispatch_key, p.now, r.resume)
      sends[#sends + 1] = r.resume
    end
  end
end

local sent = table.concat(sends, ' ')
redis.call('HSET', step_key, 'state', 'done', 'sends', sent)
local step_ttl = tonumber(p.step_ttl)
if step_ttl > 0 then redis.call('EXPIRE', step_key, step_ttl) end
return {1, sent}
