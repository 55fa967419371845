-- empty.lua: empty a sorted set of jobs (schedule, retry or dead: an operator's Clear),
-- releasing the unique locks its jobs hold in the same step.
--
-- KEYS[1]  the sorted set
--
-- Each member is read (O(members)); a lock is released only while it holds that job's jid
-- (release_unique). Returns how many entries the set held. Refuses, changing nothing, when
-- KEYS[1] holds another type.
local bad = wrong_type(KEYS[1], "zset")
if bad then
  return redis.error_reply(bad)
end
local members = redis.call("ZRANGE", KEYS[1], 0, -1)
for _, job in ipairs(members) do
  release_unique(job)
end
redis.call("UNLINK", KEYS[1])
return #members
