-- fetch.lua: acknowledge the previous job and fetch the next one, in one round trip.
--
-- KEYS[1]   this processor's in-flight list: empty, or exactly {queue key, job}
-- KEYS[2]   stat:processed            KEYS[3]  stat:processed:<UTC date>
-- KEYS[4..] queue:<name> lists, in the order to try (weighted shuffle or strict)
-- ARGV[1]   "1": the job in KEYS[1] completed: empty KEYS[1] and count it processed
-- ARGV[2]   "1": then fetch; "0": acknowledge only
-- ARGV[3]   TTL in seconds of the daily stat key
--
-- Returns false when nothing was fetched, else {queue key, job}. The job is moved
-- from the right (oldest) end of the first non-empty queue into KEYS[1] together
-- with the name of its queue, so that a crash at any moment leaves it recoverable
-- (requeue.lua) and never only in a process's memory.
if ARGV[1] == "1" then
  redis.call("DEL", KEYS[1])
  redis.call("INCR", KEYS[2])
  redis.call("INCR", KEYS[3])
  redis.call("EXPIRE", KEYS[3], ARGV[3])
end
if ARGV[2] ~= "1" then
  return false
end
for i = 4, #KEYS do
  local job = redis.call("LMOVE", KEYS[i], KEYS[1], "RIGHT", "LEFT")
  if job then
    redis.call("LPUSH", KEYS[1], KEYS[i])
    return {KEYS[i], job}
  end
end
return false
