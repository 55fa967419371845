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
-- Redis, as for Sidekiq). Returns how many jobs moved, or -1 without the lease.
if redis.call("GET", KEYS[1]) ~= ARGV[1] then
  return -1
end
local moved = 0
local now = tonumber(ARGV[2])
for i = 3, #ARGV, 3 do
  local score = redis.call("ZSCORE", KEYS[2], ARGV[i])
  if score and tonumber(score) <= now and redis.call("ZREM", KEYS[2], ARGV[i]) == 1 then
    redis.call("LPUSH", "queue:" .. ARGV[i + 2], ARGV[i + 1])
    redis.call("SADD", KEYS[3], ARGV[i + 2])
    moved = moved + 1
  end
end
return moved
