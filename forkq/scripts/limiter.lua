-- limiter.lua: one try of a rate or concurrency limiter (forkq/limiter.py), on the
-- server's clock (TIME), so every host shares one view of time.
--
-- KEYS[1]  the limiter: forkq:limiter:<kind>:<name> (a bucket's key gains :<period index>)
-- KEYS[2]  concurrent only: the holder's set of its slots, forkq:limiter:held:<holder>
--          ("" outside a forkq process), for its master to release if the process dies
-- ARGV[1]  "window" | "bucket" | "leaky" | "concurrent" | "release"
-- ARGV[2]  window, bucket, concurrent: how many are admitted; leaky: the bucket's size
-- ARGV[3]  window: seconds of the sliding window; bucket: the period in seconds (1, 60,
--          3600, 86400: calendar buckets, UTC); leaky: seconds to drain a full bucket;
--          concurrent: lock_timeout, seconds a slot is held at most
-- ARGV[4]  window, concurrent, release: this try's token (unique per entry)
--
-- Returns {wait, now}: wait is 0 when admitted (and the entry is counted), else the
-- milliseconds until room is likely (at least 1; a concurrent limiter says at most 100: a
-- slot may free at any moment); now is the server's time in milliseconds. "release" frees a
-- concurrent slot. Refuses, changing nothing, when a key
-- holds another type.
local kind = ARGV[1]
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local count = tonumber(ARGV[2])
local span = tonumber(ARGV[3]) * 1000
local function at_least_one(ms)
  return {math.max(1, math.ceil(ms)), now}
end
local ADMITTED = {0, now}

if kind == "window" or kind == "concurrent" or kind == "release" then
  local bad = wrong_type(KEYS[1], "zset") or (KEYS[2] ~= "" and wrong_type(KEYS[2], "set"))
  if bad then
    return redis.error_reply(bad)
  end
end

if kind == "window" then
  redis.call("ZREMRANGEBYSCORE", KEYS[1], "-inf", now - span)
  if redis.call("ZCARD", KEYS[1]) < count then
    redis.call("ZADD", KEYS[1], now, ARGV[4])
    redis.call("PEXPIRE", KEYS[1], span)
    return ADMITTED
  end
  local oldest = redis.call("ZRANGE", KEYS[1], 0, 0, "WITHSCORES")
  return at_least_one(tonumber(oldest[2]) + span - now)
elseif kind == "bucket" then
  local index = math.floor(now / span)
  local key = KEYS[1] .. ":" .. index
  local bad = wrong_type(key, "string")
  if bad then
    return redis.error_reply(bad)
  end
  local used = tonumber(redis.call("GET", key) or "0") or 0
  if used < count then
    redis.call("INCR", key)
    redis.call("PEXPIRE", key, span + 1000)
    return ADMITTED
  end
  return at_least_one((index + 1) * span - now)
elseif kind == "leaky" then
  local bad = wrong_type(KEYS[1], "hash")
  if bad then
    return redis.error_reply(bad)
  end
  local rate = count / span  -- drops leaked per millisecond
  local state = redis.call("HMGET", KEYS[1], "level", "at")
  local level = tonumber(state[1]) or 0
  local at = tonumber(state[2]) or now
  level = math.max(0, level - (now - at) * rate)
  if level + 1 <= count then
    redis.call("HSET", KEYS[1], "level", tostring(level + 1), "at", now)
    redis.call("PEXPIRE", KEYS[1], math.ceil(span) + 1000)
    return ADMITTED
  end
  redis.call("HSET", KEYS[1], "level", tostring(level), "at", now)
  return at_least_one((level + 1 - count) / rate)
elseif kind == "concurrent" then
  redis.call("ZREMRANGEBYSCORE", KEYS[1], "-inf", now)  -- slots past their lock_timeout
  if redis.call("ZCARD", KEYS[1]) < count then
    redis.call("ZADD", KEYS[1], now + span, ARGV[4])
    redis.call("PEXPIRE", KEYS[1], span)
    if KEYS[2] ~= "" then
      redis.call("SADD", KEYS[2], KEYS[1] .. "|" .. ARGV[4])
      redis.call("PEXPIRE", KEYS[2], span)
    end
    return ADMITTED
  end
  local first = redis.call("ZRANGE", KEYS[1], 0, 0, "WITHSCORES")
  return at_least_one(math.min(tonumber(first[2]) - now, 100))
elseif kind == "release" then
  redis.call("ZREM", KEYS[1], ARGV[4])
  if KEYS[2] ~= "" then
    redis.call("SREM", KEYS[2], KEYS[1] .. "|" .. ARGV[4])
  end
  return ADMITTED
end
return redis.error_reply("forkq: unknown limiter kind '" .. shown(kind) .. "'")
