-- remove.lua: remove one job from a queue or a sorted set by its exact bytes (an operator's
-- delete, a cancel of a waiting job), releasing its unique lock in the same step.
--
-- KEYS[1]  queue:<name> (a list) or schedule / retry / dead (a sorted set)
-- ARGV[1]  "list" | "zset": what KEYS[1] is
-- ARGV[2]  the job exactly as read (never re-encoded)
--
-- Returns 1 when the job was removed (and its lock, if it held one, released: see
-- release_unique; a job of a batch or a chain dies there, workflow.lua), 0 when KEYS[1] no
-- longer holds it. Refuses, changing nothing, when
-- KEYS[1] holds another type.
local bad = wrong_type(KEYS[1], ARGV[1])
if bad then
  return redis.error_reply(bad)
end
local removed
if ARGV[1] == "list" then
  removed = redis.call("LREM", KEYS[1], 1, ARGV[2])
else
  removed = redis.call("ZREM", KEYS[1], ARGV[2])
end
if removed > 0 then
  release_unique(ARGV[2])
  workflow_failed(ARGV[2], true)  -- it will not run: its batch or chain hears of its death
end
return removed
