-- beat.lua: write one child's heartbeat, replacing its own entry.
--
-- KEYS[1]  forkq:beats:<identity>
-- ARGV[1]  the child's pid   ARGV[2]  its beat (JSON)
-- ARGV[3]  TTL of KEYS[1], seconds, or "" to leave it (the master renews it with its record)
-- KEYS[2]  (optional) forkq:alive:<identity>, the daemon's liveness: its TTL is renewed
--          (ARGV[4] ms) while it exists; a lapsed one stays lapsed (only the master sets it
--          again). A child passes it, and ARGV[3], once its master is gone.
--
-- The old entry goes first: a beat grows nothing, and a script whose first write frees
-- memory may write on, so Redis at maxmemory with noeviction still takes the beats and
-- the master does not cull the healthy children of a full Redis. KEYS[1] of another type
-- makes that first command fail, which ends the script before it changes anything (the
-- error is the reply). Returns 1.
redis.call("HDEL", KEYS[1], ARGV[1])
redis.call("HSET", KEYS[1], ARGV[1], ARGV[2])
if ARGV[3] ~= "" then
  redis.call("EXPIRE", KEYS[1], ARGV[3])
end
if KEYS[2] then
  redis.call("PEXPIRE", KEYS[2], ARGV[4])
end
return 1
