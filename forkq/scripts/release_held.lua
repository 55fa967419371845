-- release_held.lua: free the concurrent-limiter slots a dead process held (its master,
-- when it reaps the child: forkq/limiter.py), without waiting for their lock_timeout.
--
-- KEYS[1]  forkq:limiter:held:<holder>, the process's set of "<limiter key>|<token>"
--
-- Returns how many slots were freed. A member of another shape, or a limiter key of
-- another type, is skipped; the set is deleted.
if redis.call("TYPE", KEYS[1])["ok"] ~= "set" then
  return 0
end
local freed = 0
for _, member in ipairs(redis.call("SMEMBERS", KEYS[1])) do
  local key, token = string.match(member, "^(forkq:limiter:concurrent:.*)|([^|]+)$")
  if key and redis.call("TYPE", key)["ok"] == "zset" then
    freed = freed + redis.call("ZREM", key, token)
  end
end
redis.call("DEL", KEYS[1])
return freed
