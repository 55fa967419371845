-- clear.lua: drop a queue's jobs and unlist it (`forkq queues clear`, the dashboard's Clear).
--
-- KEYS[1]  queue:<name>     KEYS[2]  queues
-- ARGV[1]  the queue's name
--
-- A queue key of another type holds no jobs: refused, nothing changed (whatever it is
-- stays for whoever wrote it). The locks of the unique jobs dropped are released in the same
-- step (each job is read: O(jobs)), and the queue's groups' index is dropped (groups.py). Returns how many jobs were dropped. A `queues` of another
-- type than a set does not stop the clear: the jobs are dropped, `queues` is left as it is.
local bad = wrong_type(KEYS[1], "list")
if bad then
  return redis.error_reply(bad .. "; queue '" .. shown(ARGV[1]) .. "' not cleared")
end
local jobs = redis.call("LRANGE", KEYS[1], 0, -1)
for _, job in ipairs(jobs) do
  release_unique(job)  -- dropped: a unique job's lock goes with it
end
local dropped = #jobs
redis.call("UNLINK", KEYS[1])
if redis.call("TYPE", rotation_of(KEYS[1]))["ok"] == "list" then
  drop_rotation(KEYS[1], rotation_of(KEYS[1]))  -- the groups' index of the jobs dropped
end
try("SREM", KEYS[2], ARGV[1])
return dropped
