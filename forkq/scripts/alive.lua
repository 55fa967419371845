-- alive.lua: a master sets its daemon's liveness key again (forkq/daemon/liveness.py).
--
-- KEYS[1]  forkq:alive:<identity>      KEYS[2]  forkq:recovered:<identity>
-- ARGV[1]  the key's TTL, milliseconds
-- ARGV[2]  "claim": set KEYS[1] only if the leader recovered none of this daemon's jobs
--          (KEYS[2] absent); "restore": forget what was recovered and set KEYS[1]
--
-- Returns 0 when KEYS[1] is set, or the count of lists the leader took (claim refused; 1
-- when KEYS[2] holds anything else): atomically with recover.lua, so after a claim that
-- returned 0 nothing can be taken. Either key may hold any type: both are replaced.
if ARGV[2] == "claim" and redis.call("EXISTS", KEYS[2]) == 1 then
  local taken = redis.pcall("GET", KEYS[2])
  return type(taken) == "string" and math.max(tonumber(taken) or 1, 1) or 1
end
redis.call("DEL", KEYS[2])
redis.call("SET", KEYS[1], "1", "PX", ARGV[1])
return 0
