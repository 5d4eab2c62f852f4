-- uses: emit, submit_turn
-- Submit a turn (see submit_turn.lib.lua).
-- KEYS: agent, turn, turn queue, seq, stream, sessions index, session, turn-start event,
--       dispatch, session agents, history
-- ARGV: payload (msgpack map, as submit_turn's p)
local k = {agent = KEYS[1], turn = KEYS[2], queue = KEYS[3], seq = KEYS[4], stream = KEYS[5],
           sessions = KEYS[6], session = KEYS[7], turnstart = KEYS[8], dispatch = KEYS[9],
           agents = KEYS[10], history = KEYS[11]}
return submit_turn(k, cmsgpack.unpack(ARGV[1]))
