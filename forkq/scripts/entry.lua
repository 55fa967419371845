-- entry.lua: one operator action on one member of schedule, retry or dead, atomically.
--
-- KEYS[1]  the sorted set holding the member
-- KEYS[2]  where it goes: queue:<name> for "queue", dead for "dead", retry for "retry"
--          (unused for "delete")
-- KEYS[3]  queues
-- ARGV[1]  the member exactly as read (its raw bytes; never re-encoded)
-- ARGV[2]  "queue" | "dead" | "retry" | "delete"
-- ARGV[3]  what to write: the job with a fresh enqueued_at ("queue") or the entry ("dead",
--          "retry")
-- ARGV[4]  the queue name, added to KEYS[3] ("queue")
-- ARGV[5]  the dead or retry entry's score   ARGV[6] trim dead entries scored at or below
-- ARGV[7]  dead set size limit
--
-- The member leaves KEYS[1] and its job arrives at the target in one step, so an action
-- neither loses nor duplicates a job, also when Sidekiq, the leader's mover or another
-- operator races it. A unique job killed or deleted releases its lock in the same step.
-- Returns 1, or 0 (nothing written) when KEYS[1] no longer holds ARGV[1].
-- Refuses, changing nothing, when the target key holds another type.
local bad = false
if ARGV[2] == "queue" then
  bad = wrong_type(KEYS[2], "list")
elseif ARGV[2] == "dead" or ARGV[2] == "retry" then
  bad = wrong_type(KEYS[2], "zset")
end
if bad then
  return redis.error_reply(bad)
end
if redis.call("ZREM", KEYS[1], ARGV[1]) == 0 then
  return 0
end
if ARGV[2] == "dead" then  -- it will not run again: a unique job's lock goes
  release_unique(ARGV[3])   -- (the job as written: a parked failure's member has a prefix)
elseif ARGV[2] == "delete" then
  release_unique(ARGV[1])
end
if ARGV[2] == "queue" then
  redis.call("LPUSH", KEYS[2], ARGV[3])
  try("SADD", KEYS[3], ARGV[4])
elseif ARGV[2] == "dead" then
  redis.call("ZADD", KEYS[2], ARGV[5], ARGV[3])
  redis.call("ZREMRANGEBYSCORE", KEYS[2], "-inf", ARGV[6])
  redis.call("ZREMRANGEBYRANK", KEYS[2], 0, -(tonumber(ARGV[7]) + 1))
elseif ARGV[2] == "retry" then
  redis.call("ZADD", KEYS[2], ARGV[5], ARGV[3])
end
return 1
