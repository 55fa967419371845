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

-- A name for a refusal's text, written as forkq.printable writes it: control bytes as \n,
-- \r, \t or \xNN (any client may name a key; a NUL would end the error message Redis
-- sends, a newline would break it).
local SHORT = {["\n"] = "\\n", ["\r"] = "\\r", ["\t"] = "\\t"}
local function shown(name)
  return (string.gsub(name, "%c", function(c)
    return SHORT[c] or string.format("\\x%02x", string.byte(c))
  end))
end

local function wrong_type(key, kind)
  local held = redis.call("TYPE", key)["ok"]
  if held ~= "none" and held ~= kind then
    return "WRONGTYPE forkq: key '" .. shown(key) .. "' holds a " .. held .. ", not a " .. kind
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


-- The deaths of a job counted so far in forkq's own counter `key`: anything else in the
-- key (another type, not a count) counts as none, and is replaced by count_death.
local function deaths_of(key)
  local deaths = 0
  if redis.call("TYPE", key)["ok"] == "string" then
    deaths = tonumber(redis.call("GET", key)) or 0
    if deaths ~= deaths or deaths < 0 or deaths >= 1e9 then
      deaths = 0
    end
    deaths = math.floor(deaths)
  end
  return deaths
end

-- Count one death of a job in `key` (TTL `ttl` seconds) and return the count (see
-- deaths_of). It deletes before it writes, so a script that calls it first works on
-- Redis at maxmemory with noeviction too.
local function count_death(key, ttl)
  local deaths = deaths_of(key) + 1
  redis.call("DEL", key)
  redis.call("SET", key, deaths, "EX", ttl)
  return deaths
end

-- Release the lock of a unique job (forkq/unique.py) when `job` (its JSON) holds one: its
-- "unique_digest" names forkq:unique:<digest>, deleted only while it holds the job's jid
-- (a lock of the wrong type, or taken since by another push, is left alone). A job that
-- names no lock costs one plain substring search; a payload cjson cannot read holds none.
local function release_unique(job)
  if type(job) ~= "string" or not string.find(job, '"unique_digest"', 1, true) then
    return
  end
  local ok, payload = pcall(cjson.decode, job)
  if not ok or type(payload) ~= "table" then
    return
  end
  local digest, jid = payload["unique_digest"], payload["jid"]
  if type(digest) ~= "string" or #digest ~= 40 or not string.match(digest, "^%x+$")
      or type(jid) ~= "string" then
    return
  end
  local key = "forkq:unique:" .. digest
  if redis.call("TYPE", key)["ok"] == "string" and redis.call("GET", key) == jid then
    redis.call("DEL", key)
  end
end
