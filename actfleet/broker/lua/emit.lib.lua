-- Library (prepended to scripts that write events).
-- emit(seq_key, stream_key, maxlen, blobs): append each msgpack event blob to the session's
-- stream with the next `seq`, so stream order and seq agree and seq has no gaps.
-- Returns the stream ids.
local function emit(seq_key, stream_key, maxlen, blobs)
  local ids = {}
  for _, blob in ipairs(blobs) do
    local seq = redis.call('INCR', seq_key)
    ids[#ids + 1] = redis.call('XADD', stream_key, 'MAXLEN', '~', maxlen, '*',
                               'seq', seq, 'e', blob)
  end
  return ids
end
