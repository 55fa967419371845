-- forget.lua: remove the records of a dead process (the leader's orphan sweep).
--
-- KEYS[1]  forkq:leader        KEYS[2]  <identity>, the process hash
-- KEYS[3]  forkq:beats:<identity>       KEYS[4]  processes
-- KEYS[5]  <identity>:workers  KEYS[6]  <identity>:work
-- KEYS[7]  forkq:alive:<identity>
-- ARGV[1]  the leader's owner token (fencing), or "" when the caller proved the process
--          gone on its own host (restart recovery): then nothing is checked
-- ARGV[2]  the identity
--
-- Only when the process is provably gone (with a token: not owner_alive, guard.lua): leave `processes` and drop the busy hashes. Returns 1 if forgotten, 0 if
-- alive, -1 without the lease.
if ARGV[1] ~= "" then
  if redis.call("GET", KEYS[1]) ~= ARGV[1] then
    return -1
  end
  if owner_alive(KEYS[2], KEYS[3], KEYS[7]) then
    return 0
  end
end
redis.call("DEL", KEYS[5], KEYS[6])
try("SREM", KEYS[4], ARGV[2])
return 1
