-- admit.lua: may the job a blocking move just brought run? (forkq/concurrency.py) A job
-- of a group leaves its group's index (forkq/groups.py: it left the queue another way
-- than its group's turn).
--
-- KEYS[1]  the processor's in-flight list, holding {queue key, job} after BLMOVE
-- ARGV[1]  the job
--
-- Returns 1 when it may run (a concurrency slot taken, or none needed), 0 when its slots
-- are all taken: it left the in-flight list for its waiting line (block in guard.lua), or
-- when the list no longer holds it (recovered meanwhile). Nothing is changed then.
if redis.call("LINDEX", KEYS[1], 1) ~= ARGV[1] then
  return 0
end
unindex_group(queue_key(redis.call("LINDEX", KEYS[1], 0)), ARGV[1])
local full = take_slot(ARGV[1])
if not full then
  return 1
end
redis.call("LPOP", KEYS[1], 2)
block(ARGV[1], full)
return 0
