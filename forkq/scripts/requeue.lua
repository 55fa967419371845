-- requeue.lua: give back the job of a processor that is gone (killed, crashed, timed out).
--
-- KEYS[1]  the in-flight list: empty, or {queue key, job} as written by fetch.lua
-- KEYS[2]  forkq:inflight, the registry of in-flight lists
-- ARGV[1]  "1": also remove KEYS[1] from the registry (its owner will not come back)
--
-- The job goes to the right end of its queue, the end processors take from, so it
-- is the next one fetched (Sidekiq's requeue on shutdown does the same RPUSH). Its
-- bytes are unchanged. The queue key is read from the list, so this script touches
-- one key that is not in KEYS: fine on a single Redis, not on Redis Cluster (not a
-- goal, as for Sidekiq). A first element that names no queue:<name> key sends the job
-- to queue:default. Refuses, changing nothing, when that queue key holds another type.
-- Returns the job, or false when the list was empty.
local queue = queue_key(redis.call("LINDEX", KEYS[1], 0))
local job = redis.call("LINDEX", KEYS[1], 1)
if job then
  local bad = wrong_type(queue, "list")
  if bad then
    return redis.error_reply(bad)
  end
end
-- the list goes first (its job is in hand): a script that has freed memory may write on,
-- so a job is given back on Redis at maxmemory with noeviction too
redis.call("DEL", KEYS[1])
if job then
  redis.call("RPUSH", queue, job)
end
if ARGV[1] == "1" then
  try("SREM", KEYS[2], KEYS[1])
end
return job or false
