-- fetch.lua: acknowledge the previous job and fetch the next ones, in one round trip.
--
-- KEYS[1]   this processor's in-flight list: empty, {queue key} (armed for a blocking
--           move, below), or pairs {queue key, job, queue key, job, ...} in the order the
--           processor runs them (the first pair is the job running or next to run)
-- KEYS[2]   stat:processed            KEYS[3]  stat:processed:<UTC date>
-- KEYS[4]   forkq:inflight, the registry of in-flight lists
-- KEYS[5]   forkq:paused, the names of the queues paused across the cluster: skipped here
--           (a key of another type pauses nothing and is reported as skipped, below)
-- KEYS[6..] the queue:<name> lists this processor fetches from
-- ARGV[1]   the last job the processor completed, or "" for none: if KEYS[1]'s pair number
--           ARGV[6] holds exactly that job, remove the first ARGV[6] pairs (the jobs it
--           completed, in order), release the locks those of them that are unique jobs
--           hold (release_unique) and count them processed
-- ARGV[2]   "1": then fetch; "0": acknowledge only
-- ARGV[3]   TTL in seconds of the daily stat key
-- ARGV[4]   "1": when nothing was found, no queue key was skipped and KEYS[6] is not paused,
--           arm KEYS[1] for a blocking move from KEYS[6]: KEYS[1] becomes {KEYS[6]}
--           (registered), so that BLMOVE KEYS[6] KEYS[1] RIGHT RIGHT makes it
--           {queue key, job} in one step
-- ARGV[5]  the depth from which a queue counts as deep (fetch_batch x concurrency)
-- ARGV[6]  how many jobs the acknowledgement covers (1 unless a batch was held)
-- ARGV[7]  the JSON value the last job acknowledged returned, for its workflow (a chain's
--          next step, a chord's results: workflow.lua), or "" for none
-- ARGV[8]  the daemon's liveness key forkq:alive:<identity>, or "" for none: while it does
--          not exist (lapsed: forkq/daemon/liveness.py) nothing is fetched, and the
--          reply is {0, ARGV[8], "lapsed"} (the acknowledgement is made all the same)
-- ARGV[9..] one queue order per job that may be taken (at most fetch_batch of them): the
--           1-based indexes into KEYS[6..] to try, comma-separated ("2,1,3"), drawn by the
--           caller (weighted shuffle or strict order) for that job
--
-- Returns {n, queue key 1, job 1, ..., queue key n, job n} of the jobs now held (n = 0 when
-- none), followed by a pair {key, type} for each queue key skipped because it holds another
-- type than a list, or KEYS[5] when it is no set (reported by the caller; the other queues
-- keep flowing), or {KEYS[6], "paused"} when asked to arm for a paused queue (not armed), then
-- {KEYS[4], type} when the registry holds another type than a set: the jobs are fetched
-- (and the list armed) all the same, unregistered (the leader's orphan sweep rebuilds the
-- registry). {} is nothing at all. Refuses, changing nothing, when KEYS[1] is not a list.
-- Its first write is a delete (the ack, or clearing KEYS[1] before a fetch), so Redis at
-- maxmemory with noeviction still lets a fetch through.
--
-- Concurrency limits (forkq/concurrency.py): a job taken whose concurrency slots are all
-- taken is not held: it moves to its waiting line (take_slot / block in guard.lua), and the
-- next free slot brings it back (release_slot, run by every step that ends a job's run).
--
-- Batching: the first job is taken from the first non-empty queue of the first order; job
-- k (k > 1) is taken by order k the same way, but only while the queue it would come from
-- still holds at least ARGV[5] jobs (a deep queue: every processor could take a batch from
-- it): a shallow queue is shared, one job each, by the processors. Consecutive jobs whose
-- orders are the same (strict order, a single queue) are taken with one RPOP ... count.
-- Each job moves from the right (oldest) end of its queue to the end of KEYS[1] with its
-- queue's name, so a crash at any moment leaves it recoverable
-- (recover.lua) and never only in a process's memory. KEYS[1] is (re)added to the registry
-- with every fetch that moves a job in, so a list the leader's orphan sweep removed from
-- the registry while its owner was cut off from Redis is tracked again.
--
-- Idempotent against a lost reply (the script ran, the connection dropped before the answer
-- arrived, the processor calls again): the ack only removes the job it names, and a fetch
-- first hands out the jobs KEYS[1] already holds, so jobs moved in by the lost call are
-- neither deleted nor stranded.
local bad = wrong_type(KEYS[1], "list")
if bad then
  return redis.error_reply(bad)
end
local registry = redis.call("TYPE", KEYS[4])["ok"]
local function register()
  if registry == "set" or registry == "none" then
    redis.call("SADD", KEYS[4], KEYS[1])
  end
end
local function noted(reply)  -- the registry's damage, reported after everything else
  if registry ~= "set" and registry ~= "none" then
    reply[#reply + 1] = KEYS[4]
    reply[#reply + 1] = registry
  end
  return reply
end
local acked = tonumber(ARGV[6])
if ARGV[1] ~= "" and redis.call("LINDEX", KEYS[1], 2 * acked - 1) == ARGV[1] then
  local done = redis.call("LPOP", KEYS[1], 2 * acked)
  local jobs = {}
  for i = 2, #done, 2 do
    release_unique(done[i])  -- a unique job's lock goes with its success
    release_slot(done[i])  -- a concurrency slot too, to the next job of its line
    jobs[#jobs + 1] = done[i]
  end
  workflow_done(jobs, ARGV[7] ~= "" and ARGV[7] or nil)  -- their batches, their chains
  try("INCRBY", KEYS[2], acked)
  try("INCRBY", KEYS[3], acked)
  try("EXPIRE", KEYS[3], ARGV[3])
end
if ARGV[2] ~= "1" then
  return {}
end
if ARGV[8] ~= "" and redis.call("EXISTS", ARGV[8]) == 0 then
  return {0, ARGV[8], "lapsed"}  -- its jobs may have been recovered: the processor waits
end
local held = redis.call("LRANGE", KEYS[1], 0, -1)
if #held >= 2 then
  local reply = {math.floor(#held / 2)}
  for i = 1, 2 * reply[1] do
    reply[#reply + 1] = held[i]
  end
  return noted(reply)
end
redis.call("DEL", KEYS[1])  -- empty, armed, or a stray element no fetch wrote
local taken, skipped, kinds = {}, {}, {}
local paused = {}  -- queue key -> true for a paused queue
local pause_kind = redis.call("TYPE", KEYS[5])["ok"]
if pause_kind == "set" then
  for i = 6, #KEYS do
    if redis.call("SISMEMBER", KEYS[5], string.sub(KEYS[i], 7)) == 1 then
      paused[KEYS[i]] = true
    end
  end
elseif pause_kind ~= "none" then
  skipped[1] = KEYS[5]
  kinds[KEYS[5]] = pause_kind
end
-- Fair tenants (forkq/groups.py): a queue with a rotation is taken from by turns. A turn
-- moves the rotation's first name to its end; a group's turn takes that group's oldest job
-- (its index's right end) out of the queue's list wherever it is: for a small group (fewer
-- than PROBE jobs, maybe come late) among the newest PROBE jobs first, else from the
-- oldest end (a group's oldest job is usually among the queue's oldest); "" takes the
-- queue's oldest job. Index entries whose job is gone are dropped, STALE at most per call.
local PROBE, STALE = 32, 100
local function turn(queue, rotation)
  local stale = 0
  for _ = 1, redis.call("LLEN", rotation) do
    local group = redis.call("LMOVE", rotation, rotation, "LEFT", "RIGHT")
    if group == "" then
      local job = redis.call("RPOP", queue)
      if job then
        unindex_group(queue, job)
        return job
      end
    elseif group then
      local list = group_key(queue, group)
      local left = redis.call("TYPE", list)["ok"] == "list" and redis.call("LLEN", list) or 0
      while left > 0 and stale < STALE do
        local job = redis.call("RPOP", list)
        left = left - 1
        local newest = left < PROBE and redis.call("LPOS", queue, job, "MAXLEN", PROBE)
        if redis.call("LREM", queue, newest and 1 or -1, job) == 1 then
          if left == 0 then
            leave_rotation(rotation, group)
          end
          return job
        end
        stale = stale + 1
      end
      if redis.call("TYPE", list)["ok"] ~= "list" then
        leave_rotation(rotation, group)  -- emptied, or of another type: its jobs run in "" turns
      end
    end
  end
  return nil
end
-- Take one job from `queue`: by turns when it has a rotation, else its oldest. An error
-- reply (a table) when the queue key holds another type.
-- A rotation whose queue is gone indexes only jobs that are gone: it is dropped.
local rotations = {}  -- queue key -> its rotation key, or false
local function take(queue)
  local rotation = rotations[queue]
  if rotation == nil then
    rotation = rotation_of(queue)
    if redis.call("TYPE", rotation)["ok"] ~= "list" then
      rotation = false
    elseif redis.call("TYPE", queue)["ok"] ~= "list" then
      if redis.call("EXISTS", queue) == 0 then
        drop_rotation(queue, rotation)
      end
      rotation = false
    end
    rotations[queue] = rotation
  end
  if rotation then
    return turn(queue, rotation)
  end
  return redis.pcall("RPOP", queue)
end
local orders = #ARGV - 8
local deep = tonumber(ARGV[5])
local k = 1
while k <= orders do
  local from = nil
  for index in string.gmatch(ARGV[8 + k], "%d+") do
    local queue = KEYS[5 + tonumber(index)]
    if queue and not kinds[queue] and not paused[queue] then
      -- the first job is popped at once; a further one only from a deep queue
      local length = k == 1 and 1 or redis.pcall("LLEN", queue)
      local job = k == 1 and take(queue)
      if type(length) == "table" or type(job) == "table" then  -- an error: another type
        kinds[queue] = redis.call("TYPE", queue)["ok"]
        skipped[#skipped + 1] = queue
      elseif job or (k > 1 and length > 0) then
        if k > 1 and length < deep then
          break  -- a shallow queue: this batch ends here
        end
        job = job or take(queue)
        if job then
          taken[#taken + 1] = queue
          taken[#taken + 1] = job
          from = queue
        end
        break
      end
    end
  end
  if not from then
    break
  end
  -- The orders after k that are the same as k's would take from the same queue (every
  -- queue before it in that order is empty or skipped), one job each while it stays deep:
  -- take those jobs with one RPOP. Where it turns shallow or empty, the loop goes on.
  local same = 0
  while not rotations[from] and k + same < orders and ARGV[9 + k + same] == ARGV[8 + k] do
    same = same + 1
  end
  local more = 0
  if same > 0 then
    more = math.max(0, math.min(same, redis.call("LLEN", from) - deep + 1))
  end
  if more > 0 then
    for _, job in ipairs(redis.call("RPOP", from, more)) do
      taken[#taken + 1] = from
      taken[#taken + 1] = job
    end
  end
  k = k + 1 + more
end
local admitted = {}  -- a job whose concurrency slots are all taken waits in its line
for i = 1, #taken, 2 do
  local full = take_slot(taken[i + 1])
  if full then
    block(taken[i + 1], full)
  else
    admitted[#admitted + 1] = taken[i]
    admitted[#admitted + 1] = taken[i + 1]
  end
end
taken = admitted
if #taken > 0 then
  redis.call("RPUSH", KEYS[1], unpack(taken))
  register()
elseif #skipped == 0 then
  if ARGV[4] == "1" and paused[KEYS[6]] then
    return noted({0, KEYS[6], "paused"})  -- not armed: the processor polls until resumed
  elseif ARGV[4] == "1" then
    redis.call("RPUSH", KEYS[1], KEYS[6])
    register()
  end
  local reply = noted({0})
  return #reply > 1 and reply or {}
end
local reply = {#taken / 2}
for i = 1, #taken do
  reply[#reply + 1] = taken[i]
end
for _, queue in ipairs(skipped) do
  reply[#reply + 1] = queue
  reply[#reply + 1] = kinds[queue]
end
return noted(reply)
