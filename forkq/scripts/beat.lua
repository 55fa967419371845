-- beat.lua: write one child's heartbeat, replacing its own entry.
--
-- KEYS[1]  forkq:beats:<identity>
-- ARGV[1]  the child's pid   ARGV[2]  its beat (JSON)   ARGV[3]  TTL of KEYS[1], seconds
-- KEYS[2]  forkq:alive:<identity>, the daemon's liveness: its TTL is renewed (ARGV[4] ms)
--          while it exists; a lapsed one stays lapsed (only the master sets it again)
--
-- The old entry goes first: a beat grows nothing, and a script whose first write frees
-- memory may write on, so Redis at maxmemory with noeviction still takes the beats and
-- the master does not cull the healthy children of a full Redis. Refuses, changing
-- nothing, when KEYS[1] holds another type. Returns 1.
local bad = wrong_type(KEYS[1], "hash")
if bad then
  return redis.error_reply(bad)
end
redis.call("HDEL", KEYS[1], ARGV[1])
redis.call("HSET", KEYS[1], ARGV[1], ARGV[2])
redis.call("EXPIRE", KEYS[1], ARGV[3])
if KEYS[2] then
  redis.call("PEXPIRE", KEYS[2], ARGV[4])
end
return 1
