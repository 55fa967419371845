-- guard.lua: the helpers served in front of every forkq script that calls them (only those:
-- forkq/scripts/__init__.py serves a script with the top-level statements it reaches).
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


-- Whether the daemon whose process hash is `hash`, children's heartbeats `beats` and
-- liveness key `alive` (forkq/keys.py) may still be running: while `alive` exists; once it
-- has lapsed, a daemon whose hash says it keeps one (the "failover" field) is gone; one
-- that keeps none (a Sidekiq process, an older forkq) is alive while `hash` or `beats`
-- exists (both expire 60 s after its last heartbeat).
local function owner_alive(hash, beats, alive)
  if redis.call("EXISTS", alive) == 1 then
    return true
  end
  if redis.call("TYPE", hash)["ok"] == "hash" and redis.call("HEXISTS", hash, "failover") == 1 then
    return false
  end
  return redis.call("EXISTS", hash) == 1 or redis.call("EXISTS", beats) == 1
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

-- The decoded payload of `job` when its bytes name `field` ('"<field>"' appears in them),
-- else nil: a job that names none costs one plain substring search, and bytes cjson cannot
-- read (or that hold no object) name nothing.
local function naming(job, field)
  if type(job) ~= "string" or not string.find(job, '"' .. field .. '"', 1, true) then
    return nil
  end
  local ok, payload = pcall(cjson.decode, job)
  if not ok or type(payload) ~= "table" then
    return nil
  end
  return payload
end

-- Release the lock of a unique job (forkq/unique.py) when `job` (its JSON) holds one: its
-- "unique_digest" names forkq:unique:<digest>, deleted only while it holds the job's jid
-- (a lock of the wrong type, or taken since by another push, is left alone). A job that
-- names no lock costs one plain substring search; a payload cjson cannot read holds none.
local function release_unique(job)
  local payload = naming(job, "unique_digest")
  if not payload then
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

-- The concurrency slot a job needs (forkq/concurrency.py): its payload's
-- "concurrency_limit" (an integer >= 1) and "concurrency_key" (a string) name the slots
-- forkq:slots:<class>:<key> (a set of the jids running) and its waiting line
-- forkq:slots:<class>:<key>:blocked (a list). Returns the slots key, the limit and the
-- jid, or nil for a job that needs none (one plain substring search when it names none).
local function slot_of(job)
  local payload = naming(job, "concurrency_limit")
  if not payload then
    return nil
  end
  local limit, key = payload["concurrency_limit"], payload["concurrency_key"]
  local klass, jid = payload["class"], payload["jid"]
  if type(limit) ~= "number" or limit < 1 or limit ~= math.floor(limit) or type(key) ~= "string"
      or type(klass) ~= "string" or type(jid) ~= "string" then
    return nil
  end
  return "forkq:slots:" .. klass .. ":" .. key, limit, jid
end

-- The queue key a job names in its payload (queue:default when it names none).
local function own_queue(job)
  local ok, payload = pcall(cjson.decode, job)
  if ok and type(payload) == "table" and type(payload["queue"]) == "string" then
    return queue_key("queue:" .. payload["queue"])
  end
  return "queue:default"
end

-- Whether `key` holds `kind` or nothing.
local function holds(key, kind)
  local held = redis.call("TYPE", key)["ok"]
  return held == kind or held == "none"
end

-- Take a slot for `job` if it needs one: nil when it may run (a slot taken, or none
-- needed), else its slots key (all taken): the caller puts it in the waiting line (block),
-- where it waits, unpolled, until a slot is freed (release_slot).
local function take_slot(job)
  local slots, limit, jid = slot_of(job)
  if not slots or not holds(slots, "set") then
    return nil  -- no slot needed, or a slots key of another type: runs unlimited
  end
  if redis.call("SISMEMBER", slots, jid) == 1 or redis.call("SCARD", slots) < limit then
    redis.call("SADD", slots, jid)
    return nil
  end
  return slots
end

-- Put `job` at the end of the waiting line of `slots` (take_slot's answer); the line is
-- listed in forkq:lines (a set, best effort) for the readers that may not SCAN (/metrics).
local function block(job, slots)
  local line = slots .. ":blocked"
  if holds(line, "list") then
    redis.call("RPUSH", line, job)
    try("SADD", "forkq:lines", line)
  else
    redis.call("RPUSH", own_queue(job), job)  -- a line of another type: back to its queue
  end
end

-- Free the slot `job` holds, if it holds one, and move the first job of its waiting line,
-- if any, to the front of its queue (the next to be fetched there): the slot's next holder.
local function release_slot(job)
  local slots, _, jid = slot_of(job)
  if not slots or redis.call("TYPE", slots)["ok"] ~= "set" then
    return
  end
  if redis.call("SREM", slots, jid) == 0 then
    return
  end
  local line = slots .. ":blocked"
  if redis.call("TYPE", line)["ok"] == "list" then
    local next_job = redis.call("LPOP", line)
    if next_job then
      local queue = own_queue(next_job)
      if holds(queue, "list") then
        redis.call("RPUSH", queue, next_job)
      else
        redis.call("LPUSH", line, next_job)  -- its queue is of another type: it waits on
      end
    end
    if redis.call("EXISTS", line) == 0 then
      try("SREM", "forkq:lines", line)
    end
  end
end

-- Fair tenants (forkq/groups.py). A job whose payload names a "group" (a non-empty string)
-- in queue:<name> is indexed on its group's list forkq:group:<#name>:<name>:<group> (oldest
-- at the right), and the group has a place in the queue's rotation forkq:groups:<name> (a
-- list of group names, "" first: the turn of the queue's oldest job) while its list holds
-- jobs. The queue's list is the truth, the index a guide (fetch.lua's turn drops entries
-- whose job is gone). Returns the group a job names, or nil (one plain substring search
-- when it names none).
local function group_of(job)
  local payload = naming(job, "group")
  if not payload or type(payload["group"]) ~= "string" or payload["group"] == "" then
    return nil
  end
  return payload["group"]
end

local function rotation_of(queue)
  return "forkq:groups:" .. string.sub(queue, 7)
end

local function group_key(queue, group)
  local name = string.sub(queue, 7)
  return "forkq:group:" .. #name .. ":" .. name .. ":" .. group
end

-- Index `job`, just pushed at the head of `queue`, if it names a group. An index key of
-- another type leaves it unindexed: it runs in the oldest job's turn.
local function index_group(queue, job)
  local group = group_of(job)
  if not group then
    return
  end
  local rotation, list = rotation_of(queue), group_key(queue, group)
  if not holds(rotation, "list") or not holds(list, "list") then
    return
  end
  if redis.call("LPUSH", list, job) == 1 then
    if redis.call("LLEN", rotation) == 0 then
      redis.call("RPUSH", rotation, "")
    end
    redis.call("RPUSH", rotation, group)
  end
end

-- Take `group` out of `rotation` (its list is empty); a rotation left with only the
-- oldest job's turn is deleted: its queue is fetched as a queue without groups again.
local function leave_rotation(rotation, group)
  redis.call("LREM", rotation, 0, group)
  if redis.call("LLEN", rotation) == 1 and redis.call("LINDEX", rotation, 0) == "" then
    redis.call("DEL", rotation)
  end
end

-- `job` left `queue` another way than its group's turn (a blocking move, the oldest
-- job's turn): drop its index entry, if it has one.
local function unindex_group(queue, job)
  local group = group_of(job)
  if not group then
    return
  end
  local rotation, list = rotation_of(queue), group_key(queue, group)
  if redis.call("TYPE", list)["ok"] ~= "list" or redis.call("LREM", list, -1, job) == 0 then
    return
  end
  if redis.call("LLEN", list) == 0 and redis.call("TYPE", rotation)["ok"] == "list" then
    leave_rotation(rotation, group)
  end
end

-- Drop `queue`'s rotation and the index lists it names (the queue holds none of their
-- jobs any more: it is gone, or cleared).
local function drop_rotation(queue, rotation)
  for _, group in ipairs(redis.call("LRANGE", rotation, 0, -1)) do
    local list = group_key(queue, group)
    if group ~= "" and redis.call("TYPE", list)["ok"] == "list" then
      redis.call("DEL", list)
    end
  end
  redis.call("DEL", rotation)
end
