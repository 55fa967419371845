-- fetch.lua: acknowledge the previous job and fetch the next one, in one round trip.
--
-- KEYS[1]   this processor's in-flight list: empty, or exactly {queue key, job}
-- KEYS[2]   stat:processed            KEYS[3]  stat:processed:<UTC date>
-- KEYS[4]   forkq:inflight, the registry of in-flight lists
-- KEYS[5..] queue:<name> lists, in the order to try (weighted shuffle or strict)
-- ARGV[1]   the job the processor completed, or "" for none: if KEYS[1] still holds
--           exactly that job, empty KEYS[1] and count it processed
-- ARGV[2]   "1": then fetch; "0": acknowledge only
-- ARGV[3]   TTL in seconds of the daily stat key
--
-- Returns false when nothing was fetched, else {queue key, job}. The job is moved
-- from the right (oldest) end of the first non-empty queue into KEYS[1] together
-- with the name of its queue, so that a crash at any moment leaves it recoverable
-- (requeue.lua) and never only in a process's memory. KEYS[1] is (re)added to the
-- registry with every job moved in, so a list the leader's orphan sweep removed from
-- the registry while its owner was cut off from Redis is tracked again.
--
-- Idempotent against a lost reply (the script ran, the connection dropped before
-- the answer arrived, the processor calls again): the ack only removes the job it
-- names, and a fetch first hands out a job KEYS[1] already holds, so a job moved
-- in by the lost call is neither deleted nor stranded behind another.
if ARGV[1] ~= "" and redis.call("LINDEX", KEYS[1], 1) == ARGV[1] then
  redis.call("DEL", KEYS[1])
  redis.call("INCR", KEYS[2])
  redis.call("INCR", KEYS[3])
  redis.call("EXPIRE", KEYS[3], ARGV[3])
end
if ARGV[2] ~= "1" then
  return false
end
local held = redis.call("LRANGE", KEYS[1], 0, 1)
if #held == 2 then
  return held
end
for i = 5, #KEYS do
  local job = redis.call("LMOVE", KEYS[i], KEYS[1], "RIGHT", "LEFT")
  if job then
    redis.call("LPUSH", KEYS[1], KEYS[i])
    redis.call("SADD", KEYS[4], KEYS[1])
    return {KEYS[i], job}
  end
end
return false
