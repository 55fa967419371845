-- guard.lua: prepended to every forkq script (forkq/scripts/__init__.py).
--
-- Redis does not roll back a script's earlier writes when a later command fails, so a
-- script checks every key it will write before its first write and refuses, writing
-- nothing, when one holds another type:
--
--   local bad = wrong_type(KEYS[2], "zset")
--   if bad then return redis.error_reply(bad) end
--
-- The refusal names the key: "WRONGTYPE forkq: key 'retry' holds a hash, not a zset".
local function wrong_type(key, kind)
  local held = redis.call("TYPE", key)["ok"]
  if held ~= "none" and held ~= kind then
    return "WRONGTYPE forkq: key '" .. key .. "' holds a " .. held .. ", not a " .. kind
  end
  return false
end

-- A write that must not stop a script that has moved a job already (counters, the
-- `queues` index, registry bookkeeping): errors are returned, not raised.
local function try(...)
  return redis.pcall(...)
end

-- The queue a job read from an in-flight list goes back to: its first element when that
-- names a queue, else queue:default (any client can write anything into any key).
local function queue_key(name)
  if type(name) == "string" and string.sub(name, 1, 6) == "queue:" and #name > 6 then
    return name
  end
  return "queue:default"
end

