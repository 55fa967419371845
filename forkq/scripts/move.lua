-- move.lua: move due jobs from schedule or retry into their queues (the leader only).
--
-- KEYS[1]  forkq:leader        KEYS[2]  the sorted set: schedule or retry
-- KEYS[3]  queues
-- ARGV[1]  the leader's owner token (fencing: nothing happens unless KEYS[1] holds it)
-- ARGV[2]  now: only members still scored at or below it move
-- ARGV[3..] triples: the member as it sits in KEYS[2], the job to push (the same with
--           a fresh enqueued_at), its queue name
--
-- A member is pushed only if this script removed it from KEYS[2], so a job is moved
-- once even if two callers race, and never lost: removal and push are one atomic step.
-- A member rescheduled to the future since it was read (Sidekiq's reschedule) stays.
-- The queue key is built here from the name (one key not in KEYS: fine on a single
-- Redis, as for Sidekiq). A member whose queue key holds another type than a list stays
-- in KEYS[2], and the others move. Returns {moved, then a pair {key, type} for each key
-- of the wrong type met}, or -1 without the lease.
if redis.call("GET", KEYS[1]) ~= ARGV[1] then
  return -1
end
local reply = {0}
local seen = {}
local function skip(key, kind)
  if not seen[key] then
    seen[key] = true
    reply[#reply + 1] = key
    reply[#reply + 1] = kind
  end
end
local now = tonumber(ARGV[2])
for i = 3, #ARGV, 3 do
  local queue = "queue:" .. ARGV[i + 2]
  local score = redis.call("ZSCORE", KEYS[2], ARGV[i])
  if score and tonumber(score) <= now then
    local kind = redis.call("TYPE", queue)["ok"]
    if kind ~= "none" and kind ~= "list" then
      skip(queue, kind)
    elseif redis.call("ZREM", KEYS[2], ARGV[i]) == 1 then
      redis.call("LPUSH", queue, ARGV[i + 1])
      index_group(queue, ARGV[i + 1])  -- a job of a group joins its rotation (groups.py)
      if type(try("SADD", KEYS[3], ARGV[i + 2])) == "table" then
        skip(KEYS[3], redis.call("TYPE", KEYS[3])["ok"])
      end
      reply[1] = reply[1] + 1
    end
  end
end
return reply
