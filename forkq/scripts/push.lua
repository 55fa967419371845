-- push.lua: push a job that needs more than an LPUSH, in one step: a unique job takes its
-- lock (forkq/unique.py); a job of a group pushed to its queue joins the queue's rotation
-- (index_group in guard.lua, forkq/groups.py); a job pushed in a batch (forkq/batches.py)
-- becomes its member only when it is pushed.
--
-- KEYS[1]  the lock, forkq:unique:<digest> (for a job without one: KEYS[2] again, untouched;
--          an ACL may not grant the empty name)
-- KEYS[2]  where the job goes: queue:<name> (a list) or schedule (a sorted set)
-- KEYS[3]  queues, the index of queue names (best effort)
-- ARGV[1]  the job's jid, held by the lock
-- ARGV[2]  the lock's TTL in seconds, or "" for a job without a lock
-- ARGV[3]  the job JSON
-- ARGV[4]  the score (run-at epoch) for schedule, or "" to push to the queue now
-- ARGV[5]  the queue's name, for KEYS[3]
-- ARGV[6]  the bid of the batch the job joins (forkq:batch:<bid>: its jid joins the pending
--          members and the total grows by one), or "" for none
--
-- Returns 1 when the job was pushed (with its lock), 0 when the lock is held (by an
-- earlier push of the same job): nothing is written then. Refuses, writing nothing, when
-- KEYS[1] or KEYS[2] holds another type (the error names the key).
local locked = ARGV[2] ~= ""
local bad = (locked and wrong_type(KEYS[1], "string"))
  or wrong_type(KEYS[2], ARGV[4] == "" and "list" or "zset")
if bad then
  return redis.error_reply(bad)
end
if locked and not redis.call("SET", KEYS[1], ARGV[1], "NX", "EX", ARGV[2]) then
  return 0
end
if ARGV[4] == "" then
  redis.call("LPUSH", KEYS[2], ARGV[3])
  index_group(KEYS[2], ARGV[3])
  try("SADD", KEYS[3], ARGV[5])
else
  redis.call("ZADD", KEYS[2], ARGV[4], ARGV[3])
end
if (ARGV[6] or "") ~= "" then
  try("SADD", batch_key(ARGV[6]) .. ":pending", ARGV[1])
  try("HINCRBY", batch_key(ARGV[6]), "total", 1)
end
return 1
