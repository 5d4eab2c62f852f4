-- uses: emit
-- Append events to a session's stream.
-- KEYS: seq, stream
-- ARGV: maxlen, blob...
-- Returns: the stream ids.
local seq_key, stream_key = KEYS[1], KEYS[2]
local maxlen = ARGV[1]
return emit(seq_key, stream_key, maxlen, {unpack(ARGV, 2)})
