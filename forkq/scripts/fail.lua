-- fail.lua: file a failed (or unrunnable) job and release it from the in-flight list.
--
-- KEYS[1]  this processor's in-flight list: its first pair is released
-- KEYS[2]  the sorted set to file into: retry or dead (ignored when ARGV[1] is "drop")
-- KEYS[3]  stat:processed   KEYS[4] stat:processed:<date>
-- KEYS[5]  stat:failed      KEYS[6] stat:failed:<date>
-- ARGV[1]  "retry" | "dead" | "drop" | "reschedule" (an over-limit job back to schedule:
--          filed as a retry is, but counted neither processed nor failed)
-- ARGV[2]  the job JSON with its error fields (Sidekiq's job_retry layout)
-- ARGV[3]  score: when the retry is due, or the time of death
-- ARGV[4]  TTL in seconds of the daily stat keys
-- ARGV[5]  dead set: entries scored at or below this are trimmed (now - 180 days)
-- ARGV[6]  dead set: entries kept at most (10000)
-- KEYS[7]  forkq:unfiled, where a failure waits while KEYS[2] holds another type
-- ARGV[7]  the job as fetched: nothing happens unless KEYS[1] still holds it
-- KEYS[8]  forkq:cancels       ARGV[8]  a cancelled job's jid, whose request the filing
--          carries out (removed from KEYS[8]), or "" for none
--
-- Returns the mode, "parked" when KEYS[2] holds another type than a sorted set (the
-- failure goes to KEYS[7] as "<mode>|<job>" at the same score, for the leader to file once
-- KEYS[2] is mended: the processor works on), or "gone" when KEYS[1] no longer holds
-- ARGV[7] (the leader's orphan sweep gave the job back while this process was cut off:
-- it is queued again, so filing the failure too would run it twice). A unique job's lock
-- is released when the job goes to the dead set or is dropped (a retry keeps it; a parked
-- failure too, until its filing). A job of a batch or a chain counts as failed there
-- (workflow.lua: dead or dropped, it dies; its callbacks fire in this step). Counts one processed
-- and one failed execution, as Sidekiq (best effort: a counter of the wrong type does not
-- stop the filing). Refuses, changing nothing, when KEYS[2] and KEYS[7] both hold another
-- type than a sorted set: the job stays held.
-- The release (LPOP of the first pair; jobs held behind it stay) is the first write: at
-- maxmemory (noeviction) the filing goes through.
if redis.call("LINDEX", KEYS[1], 1) ~= ARGV[7] then
  return "gone"
end
local mode = ARGV[1]
if mode ~= "drop" then
  local bad = wrong_type(KEYS[2], "zset")
  if bad and wrong_type(KEYS[7], "zset") then
    return redis.error_reply(bad)
  elseif bad then
    mode = "parked"
  end
end
redis.call("LPOP", KEYS[1], 2)
release_slot(ARGV[7])  -- its run ended: its concurrency slot goes to the next in line
if mode == "parked" then
  redis.call("ZADD", KEYS[7], ARGV[3], ARGV[1] .. "|" .. ARGV[2])
elseif mode ~= "drop" then
  redis.call("ZADD", KEYS[2], ARGV[3], ARGV[2])
end
if mode == "dead" or mode == "drop" then
  release_unique(ARGV[2])  -- a unique job's lock goes when it will not run again
end
if ARGV[1] ~= "reschedule" then  -- its batch or chain hears of it (workflow.lua)
  workflow_failed(ARGV[7], ARGV[1] == "dead" or ARGV[1] == "drop")
end
if mode == "dead" then
  redis.call("ZREMRANGEBYSCORE", KEYS[2], "-inf", ARGV[5])
  redis.call("ZREMRANGEBYRANK", KEYS[2], 0, -(tonumber(ARGV[6]) + 1))
end
if ARGV[8] ~= "" then
  try("ZREM", KEYS[8], ARGV[8])
end
if ARGV[1] == "reschedule" then
  return mode
end
for i = 3, 6 do
  try("INCR", KEYS[i])
end
try("EXPIRE", KEYS[4], ARGV[4])
try("EXPIRE", KEYS[6], ARGV[4])
return mode
