-- fetch.lua: acknowledge the previous job and fetch the next one, in one round trip.
--
-- KEYS[1]   this processor's in-flight list: empty, {queue key} (armed for a blocking
--           move, below), or exactly {queue key, job}
-- KEYS[2]   stat:processed            KEYS[3]  stat:processed:<UTC date>
-- KEYS[4]   forkq:inflight, the registry of in-flight lists
-- KEYS[5..] queue:<name> lists, in the order to try (weighted shuffle or strict)
-- ARGV[1]   the job the processor completed, or "" for none: if KEYS[1] still holds
--           exactly that job, empty KEYS[1] and count it processed
-- ARGV[2]   "1": then fetch; "0": acknowledge only
-- ARGV[3]   TTL in seconds of the daily stat key
-- ARGV[4]   "1": when nothing was found and no queue key was skipped, arm KEYS[1] for a
--           blocking move from KEYS[5]: KEYS[1] becomes {KEYS[5]} (registered), so that
--           BLMOVE KEYS[5] KEYS[1] RIGHT RIGHT makes it {queue key, job} in one step
--
-- Returns an array: {queue key, job} of the job fetched, or {"", ""} when none was, followed
-- by a pair {key, type} for each queue key skipped because it holds another type than a
-- list (reported by the caller; the other queues keep flowing). {} is nothing at all.
-- Refuses, changing nothing but the acknowledgement, when KEYS[1] is not a list or KEYS[4]
-- not a set. Its first write is a delete (the ack, or clearing KEYS[1] before a fetch), so
-- Redis at maxmemory with noeviction still lets a fetch through: it moves a job and grows
-- nothing but a few bytes of bookkeeping. The job is moved
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
local bad = wrong_type(KEYS[1], "list") or wrong_type(KEYS[4], "set")
if bad then
  return redis.error_reply(bad)
end
if ARGV[1] ~= "" and redis.call("LINDEX", KEYS[1], 1) == ARGV[1] then
  redis.call("DEL", KEYS[1])
  try("INCR", KEYS[2])
  try("INCR", KEYS[3])
  try("EXPIRE", KEYS[3], ARGV[3])
end
if ARGV[2] ~= "1" then
  return {}
end
local held = redis.call("LRANGE", KEYS[1], 0, 1)
if #held == 2 then
  return held
end
redis.call("DEL", KEYS[1])  -- empty, or a stray element no fetch wrote
local reply = {"", ""}
for i = 5, #KEYS do
  local job = redis.pcall("LMOVE", KEYS[i], KEYS[1], "RIGHT", "LEFT")
  if type(job) == "table" then  -- an error: a queue key of another type is skipped
    local kind = redis.call("TYPE", KEYS[i])["ok"]
    if kind == "list" then
      return job
    end
    reply[#reply + 1] = KEYS[i]
    reply[#reply + 1] = kind
  elseif job then
    redis.call("LPUSH", KEYS[1], KEYS[i])
    redis.call("SADD", KEYS[4], KEYS[1])
    reply[1], reply[2] = KEYS[i], job
    return reply
  end
end
if #reply == 2 then
  if ARGV[4] == "1" then
    redis.call("RPUSH", KEYS[1], KEYS[5])
    redis.call("SADD", KEYS[4], KEYS[1])
  end
  return {}
end
return reply
