-- periodic.lua: handle one tick of a periodic job exactly once (the leader only).
--
-- KEYS[1]  forkq:leader        KEYS[2]  forkq:periodic (entry name -> last tick handled)
-- KEYS[3]  queue:<name> of the job (unused when ARGV[4] is "")
-- KEYS[4]  queues
-- ARGV[1]  the leader's owner token (fencing)
-- ARGV[2]  the entry name      ARGV[3]  the tick, epoch seconds
-- ARGV[4]  the job to enqueue, or "" to mark the tick handled without enqueueing
-- ARGV[5]  the queue name
--
-- Returns 1 when the tick was handled now, 0 when a tick at or after it was handled
-- before (by this leader or an earlier one), -1 without the lease. Refuses, changing
-- nothing, when KEYS[2] or KEYS[3] holds another type.
if redis.call("GET", KEYS[1]) ~= ARGV[1] then
  return -1
end
local bad = wrong_type(KEYS[2], "hash") or (ARGV[4] ~= "" and wrong_type(KEYS[3], "list"))
if bad then
  return redis.error_reply(bad)
end
local last = redis.call("HGET", KEYS[2], ARGV[2])
if last and tonumber(last) >= tonumber(ARGV[3]) then
  return 0
end
redis.call("HSET", KEYS[2], ARGV[2], ARGV[3])
if ARGV[4] ~= "" then
  redis.call("LPUSH", KEYS[3], ARGV[4])
  try("SADD", KEYS[4], ARGV[5])
end
return 1
