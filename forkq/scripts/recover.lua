-- recover.lua: give back the in-flight job of a dead process: a child the master reaped,
-- or a dead daemon's (the leader's orphan sweep, a restart's recovery); caller:
-- forkq/daemon/held_jobs.py.
--
-- KEYS[1]  forkq:leader        KEYS[2]  the in-flight list: empty, {queue key}, or pairs
--          {queue key, job, ...}: the first is the job its holder ran (or was about to),
--          the others jobs it held without starting them (a batch, fetch.lua)
-- KEYS[3]  forkq:inflight      KEYS[4]  <identity>, the owner's process hash
-- KEYS[5]  forkq:beats:<identity>, its children's heartbeats
-- KEYS[6]  forkq:kills:<jid>   KEYS[7]  dead
-- ARGV[1]  the leader's owner token (fencing), or "" when the caller knows the owner gone
--          (the master reaped its child; a restart proved its earlier incarnation gone on
--          this host): then neither the lease nor the owner's records are checked
-- ARGV[2]  the first job the caller saw in KEYS[2], or "" for none
-- ARGV[3]  "count": count this recovery as a death of the job (KEYS[6]);
--          "bury": file ARGV[5] to the dead set now (a malformed job, raw bytes kept);
--          "requeue": just requeue it (an empty list has nothing to requeue)
-- ARGV[4]  deaths at which the job goes to the dead set instead (3)
-- ARGV[5]  the dead-set entry to write at that limit (or at once to bury), or "" to drop
-- ARGV[6]  TTL of KEYS[6], seconds
-- ARGV[7]  now (the dead entry's score)   ARGV[8] trim dead entries scored at or below
-- ARGV[9]  dead set size limit
-- ARGV[10] the length of KEYS[2] the caller saw
-- KEYS[8]  forkq:cancels       ARGV[11] the jid of a cancelled first job (mode "bury"),
--          whose request is withdrawn with the burial, or ""
-- KEYS[9]  forkq:alive:<identity>, the owner's liveness
-- KEYS[10] forkq:recovered:<identity>, counted (TTL ARGV[12] s) when the leader takes jobs
--
-- Never from a live owner: with a token, nothing happens while owner_alive(KEYS[4], KEYS[5],
-- KEYS[9]) (guard.lua: a forkq daemon's liveness lapsed, or the 60 s records of another
-- process expired), and taking jobs counts KEYS[10], so that the owner, if it was only
-- frozen or cut off, knows it holds them no more (forkq/daemon/liveness.py);
-- without a token, the caller has proved the owner's master and child gone (same kernel
-- run, pid free or reused). Nothing
-- happens either if KEYS[2] no longer holds ARGV[2] first or changed length. Otherwise
-- the jobs held without being started go back unchanged to the right end (the front) of
-- their queues in the order they were held, then the first job goes back in front of them
-- (the next one fetched), or to the dead set at the death limit (at once when malformed);
-- only the first job's death is counted; a buried job's batch or chain hears of its death. KEYS[2] is deleted and unregistered. A first element that
-- names no queue:<name> key sends the job to queue:default. Refuses, changing nothing,
-- when a key it is about to write holds another type: a queue a job goes back to, or
-- KEYS[7] when the job goes to the dead set (KEYS[6] is forkq's own counter:
-- count_death restarts it). Returns {outcome, deaths}: "requeued", "dead", "dropped" or
-- "empty", and the job's deaths counted so far (0 when not counted); or -1 without the
-- lease, -2 when the owner is alive, -3 when the list changed.
if ARGV[1] ~= "" then
  if redis.call("GET", KEYS[1]) ~= ARGV[1] then
    return -1
  end
  if owner_alive(KEYS[4], KEYS[5], KEYS[9]) then
    return -2
  end
end
local list = redis.call("LRANGE", KEYS[2], 0, -1)
local queue = queue_key(list[1])
local job = list[2]
if (job or "") ~= ARGV[2] or #list ~= tonumber(ARGV[10]) then
  return -3
end
local deaths = 0
local bury = false
if job then
  if ARGV[3] == "count" then
    deaths = deaths_of(KEYS[6]) + 1
  end
  bury = ARGV[3] == "bury" or deaths >= tonumber(ARGV[4])
  local bad = false
  if bury and ARGV[5] ~= "" then
    bad = wrong_type(KEYS[7], "zset")
  elseif not bury then
    bad = wrong_type(queue, "list")
  end
  for i = 3, #list - 1, 2 do
    bad = bad or wrong_type(queue_key(list[i]), "list")
  end
  if bad then
    return redis.error_reply(bad)
  end
end
-- The in-flight list goes first (its job is in hand): a script that has freed memory may
-- write on, so the sweep works on Redis at maxmemory with noeviction too. Nothing after
-- this may fail: every key was checked above.
redis.call("DEL", KEYS[2])
for i = 2, #list, 2 do
  release_slot(list[i])  -- none of its jobs runs now: their concurrency slots go
end
local outcome = "empty"
if job then
  outcome = "requeued"
  if ARGV[3] == "count" then
    count_death(KEYS[6], ARGV[6])
  end
  if bury then
    outcome = "dropped"
    release_unique(job)  -- buried: a unique job's lock goes with it (a requeue keeps it)
    if ARGV[5] ~= "" then
      outcome = "dead"
      redis.call("ZADD", KEYS[7], ARGV[7], ARGV[5])
      redis.call("ZREMRANGEBYSCORE", KEYS[7], "-inf", ARGV[8])
      redis.call("ZREMRANGEBYRANK", KEYS[7], 0, -(tonumber(ARGV[9]) + 1))
    end
    if ARGV[11] ~= "" then
      try("ZREM", KEYS[8], ARGV[11])
    end
    workflow_failed(job, true)  -- its batch or chain hears of its death (workflow.lua)
  end
  for i = #list - (#list % 2) - 1, 3, -2 do  -- held, not started: the last one first
    redis.call("RPUSH", queue_key(list[i]), list[i + 1])
  end
  if outcome == "requeued" then
    redis.call("RPUSH", queue, job)
  end
end
try("SREM", KEYS[3], KEYS[2])
if ARGV[1] ~= "" and #list >= 2 then
  try("INCR", KEYS[10])
  try("EXPIRE", KEYS[10], ARGV[12])
end
return {outcome, deaths}
