-- uses: emit, open_request
-- Open an approval request that a running cell waits on (a shell command), and announce it.
-- KEYS: approval record, pending approvals, session's pending approvals, approval expiry,
--       seq, stream
-- ARGV: payload (msgpack map): record (map of fields), event (ApprovalRequest blob), maxlen
-- Returns: 1
local record_key, pending_key, session_pending_key, expiry_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local seq_key, stream_key = KEYS[5], KEYS[6]
local p = cmsgpack.unpack(ARGV[1])
open_request(record_key, pending_key, session_pending_key, expiry_key, p.record)
emit(seq_key, stream_key, p.maxlen, {p.event})
return 1
