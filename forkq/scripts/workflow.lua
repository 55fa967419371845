-- workflow.lua: served after guard.lua in front of the scripts that call it (its statements
-- they reach: forkq/scripts/__init__.py):
-- the bookkeeping of batches and chains (forkq/batches.py, forkq/canvas.py), run by the
-- scripts that end a job's run: the acknowledgement (fetch.lua), the filing of a failure
-- (fail.lua), the burial of a dead process's job (recover.lua). A callback is pushed here,
-- in the same step as the state change that fires it, once: guarded by a field set once
-- ("<event>_at"), never by a client-side check. (Only commands the documented ACL user
-- may run: docs/redis.md.)
--
-- A batch forkq:batch:<bid> (a hash: "committed", "total", "parent", "chord", "description",
-- "created_at", the callbacks "cb:<event>" and the moments "<event>_at" they fired) has
-- members: jobs (by jid), chains (by chain id) and child batches (by bid).
--   forkq:batch:<bid>:pending  a set: the members that have not succeeded yet
--   forkq:batch:<bid>:failed   a set: the pending members whose last run failed
--   forkq:batch:<bid>:results  a hash (a chord): member -> the JSON value it returned
--   forkq:batch:<bid>:order    a list (a chord): its members in the group's order
-- Events: "complete" when every pending member has failed (every member ran at least once),
-- "success" when none is pending, "death" when a member first dies (goes to dead, or is
-- dropped). A member counts once: only its removal from the pending set counts it.
--
-- A chain forkq:chain:<cid> (a hash: "n" steps, "step" the one running, "state", "bid" when
-- it is a batch's member, "s:<i>" the template of step i > 1, "jid:<i>", "class:<i>").
-- A step's job names "chain" and "chain_step"; its success pushes the next step with its
-- value as first argument, once: only while "step" names it.
--
-- A template is "<queue>\0<head>\0<tail>": a job's JSON cut where its first argument
-- goes; pushing it writes head .. <first argument> .. tail, with "enqueued_at" added.

local LINGER = 86400  -- seconds a batch or chain is kept after it succeeded (or failed)
local STATS = "forkq:stat:batches"  -- a hash of counters: created, complete, success, death

local function now_text()
  local t = redis.call("TIME")
  return t[1] .. "." .. string.format("%06d", tonumber(t[2]))
end

-- Push `template` with `first` (JSON) as its first argument; false when it is malformed.
local function push_template(template, first)
  local a = string.find(template, "\0", 1, true)
  local b = a and string.find(template, "\0", a + 1, true)
  if not b then
    return false
  end
  local name = string.sub(template, 1, a - 1)
  local queue = "queue:" .. name
  if not holds(queue, "list") then
    return false
  end
  local tail = string.sub(template, b + 1, -2)  -- without its closing brace
  local job = string.sub(template, a + 1, b - 1) .. first .. tail .. ',"enqueued_at":'
    .. now_text() .. "}"
  redis.call("LPUSH", queue, job)
  index_group(queue, job)
  try("SADD", "queues", name)
  return true
end

local function batch_key(bid)
  return "forkq:batch:" .. bid
end

-- What a callback receives: the batch's status (a chord's success: its results in order).
local function batch_status(bid, event)
  local meta = batch_key(bid)
  if event == "success" and redis.call("HGET", meta, "chord") == "1" then
    local order = holds(meta .. ":order", "list") and redis.call("LRANGE", meta .. ":order", 0, -1)
      or {}
    local results = holds(meta .. ":results", "hash") and meta .. ":results"
    local values = {}
    for i = 1, #order, 1000 do  -- unpack's stack holds a few thousand values at most
      local part = results and redis.call("HMGET", results, unpack(order, i, math.min(i + 999, #order)))
        or {}
      for j = i, math.min(i + 999, #order) do
        values[j] = part[j - i + 1] or "null"
      end
    end
    return "[" .. table.concat(values, ",") .. "]"
  end
  local total = tonumber(redis.call("HGET", meta, "total")) or 0
  local pending = redis.call("SCARD", meta .. ":pending")
  return cjson.encode({bid = bid, total = total, pending = pending,
    failures = redis.call("SCARD", meta .. ":failed"), succeeded = total - pending,
    complete = redis.call("HGET", meta, "complete_at") ~= false,
    description = redis.call("HGET", meta, "description") or ""})
end

-- Mark `event` of batch `bid` as happened (once) and push its callback; whether it is new.
local function fire(bid, event)
  local meta = batch_key(bid)
  if redis.call("HGET", meta, event .. "_at") then
    return false
  end
  redis.call("HSET", meta, event .. "_at", now_text())
  try("HINCRBY", STATS, event, 1)
  local template = redis.call("HGET", meta, "cb:" .. event)
  if template then
    push_template(template, batch_status(bid, event))
  end
  return true
end

local function linger(key, ...)
  for _, suffix in ipairs({"", ...}) do
    redis.call("EXPIRE", key .. suffix, LINGER)
  end
end

local member_failed  -- (bid, member, dead): defined below, called up the tree of batches

-- A member of `bid` died: the batch's death, and its parents', fire once.
local function died(bid)
  local meta = batch_key(bid)
  while bid and redis.call("TYPE", meta)["ok"] == "hash" do
    fire(bid, "death")
    bid = redis.call("HGET", meta, "parent")
    meta = bid and batch_key(bid)
  end
end

-- Fire what the batch's state now calls for: complete when every pending member failed,
-- success when none is pending; a child batch then counts in its parent. `pending` and
-- `failed` are the sizes of its sets when the caller has read them.
local member_succeeded
local function settle(bid, pending, failed)
  local meta = batch_key(bid)
  pending = pending or redis.pcall("SCARD", meta .. ":pending")
  failed = failed or redis.pcall("SCARD", meta .. ":failed")
  if type(pending) ~= "number" or type(failed) ~= "number" or pending > failed
      or redis.pcall("HGET", meta, "committed") ~= "1" then
    return  -- a key of another type: the batch is left alone
  end
  local parent = redis.call("HGET", meta, "parent")
  if pending == failed and fire(bid, "complete") and pending > 0 and parent then
    member_failed(parent, bid, false)  -- complete with failures: a failure of its parent
  end
  if pending == 0 and fire(bid, "success") then
    linger(meta, ":pending", ":failed", ":results", ":order")
    if parent then
      member_succeeded(parent, {bid}, nil)
    end
  end
end

-- `members` (a list) of batch `bid` succeeded; a lone member returned `value` (JSON, or
-- nil). Each counts once, when it leaves the pending set (a set of another type counts
-- nothing). While members that have not failed are pending, this is three commands for all
-- of them: SREM, SCARD, SCARD.
member_succeeded = function(bid, members, value)
  local meta = batch_key(bid)
  local removed = redis.pcall("SREM", meta .. ":pending", unpack(members))
  if type(removed) ~= "number" or removed == 0 then
    return
  end
  local failed = redis.pcall("SCARD", meta .. ":failed")
  if type(failed) == "number" and failed > 0 then
    failed = failed - redis.call("SREM", meta .. ":failed", unpack(members))
  end
  if value and redis.pcall("HGET", meta, "chord") == "1" then
    try("HSET", meta .. ":results", members[1], value)
  end
  settle(bid, redis.pcall("SCARD", meta .. ":pending"), failed)
end

-- `member` of batch `bid` failed; `dead`: it will not run again.
member_failed = function(bid, member, dead)
  local meta = batch_key(bid)
  if redis.call("TYPE", meta)["ok"] ~= "hash"
      or redis.pcall("SISMEMBER", meta .. ":pending", member) ~= 1 then
    return
  end
  if redis.pcall("SADD", meta .. ":failed", member) == 1
      and redis.call("PTTL", meta .. ":failed") == -1 and redis.call("PTTL", meta) > 0 then
    redis.call("PEXPIRE", meta .. ":failed", redis.call("PTTL", meta))
  end
  if dead then
    died(bid)
  end
  settle(bid)
end

local function chain_key(cid)
  return "forkq:chain:" .. cid
end

-- The chain of a step's payload and whether `step` is the one it runs now.
local function current_step(payload)
  local cid, step = payload["chain"], payload["chain_step"]
  if type(cid) ~= "string" or type(step) ~= "number" then
    return nil
  end
  local key = chain_key(cid)
  if redis.call("TYPE", key)["ok"] ~= "hash" or redis.call("HGET", key, "step") ~= tostring(step) then
    return nil
  end
  return key, cid, step
end

-- A chain's step succeeded with `value`: the next step is pushed, or the chain is done.
local function step_succeeded(payload, value)
  local key, cid, step = current_step(payload)
  if not key then
    return
  end
  value = value or "null"
  local n = tonumber(redis.call("HGET", key, "n")) or step
  if step < n then
    redis.call("HSET", key, "step", step + 1)
    if push_template(redis.call("HGET", key, "s:" .. (step + 1)) or "", value) then
      return
    end
    redis.call("HSET", key, "state", "failed", "failed_step", step + 1)  -- unpushable
  else
    redis.call("HSET", key, "step", n + 1, "state", "succeeded")
  end
  linger(key)
  local bid = redis.call("HGET", key, "bid")
  if bid and redis.call("HGET", key, "state") == "succeeded" then
    member_succeeded(bid, {cid}, value)
  elseif bid then
    member_failed(bid, cid, true)
  end
end

local function step_failed(payload, dead)
  local key, cid, step = current_step(payload)
  if not key then
    return
  end
  if dead then
    redis.call("HSET", key, "state", "failed", "failed_step", step)
    linger(key)
  end
  local bid = redis.call("HGET", key, "bid")
  if bid then
    member_failed(bid, cid, dead)
  end
end

-- The decoded payload of a job that takes part in a workflow (names "bid" or "chain").
local function workflow_of(job)
  return naming(job, "bid") or naming(job, "chain")
end

-- `jobs` (a list), acknowledged together, ran to their end; the last returned `value`
-- (JSON), or nil. The jobs of one batch among them are counted together (one SREM), after
-- the chains' next steps are pushed.
local function workflow_done(jobs, value)
  local members, bids = {}, {}  -- bid -> its jids here; the bids in order
  for i, job in ipairs(jobs) do
    local payload = workflow_of(job)
    if payload then
      local bid, jid = payload["bid"], payload["jid"]
      local carried = i == #jobs and value or nil
      if type(bid) == "string" and type(jid) == "string" and carried then
        member_succeeded(bid, {jid}, carried)  -- a chord's member: its value is kept
      elseif type(bid) == "string" and type(jid) == "string" then
        if not members[bid] then
          members[bid] = {}
          bids[#bids + 1] = bid
        end
        table.insert(members[bid], jid)
      end
      step_succeeded(payload, carried)
    end
  end
  for _, bid in ipairs(bids) do
    member_succeeded(bid, members[bid], nil)
  end
end

-- `job` failed; `dead`: it will not run again (dead set, or dropped).
local function workflow_failed(job, dead)
  local payload = workflow_of(job)
  if not payload then
    return
  end
  if type(payload["bid"]) == "string" and type(payload["jid"]) == "string" then
    member_failed(payload["bid"], payload["jid"], dead)
  end
  step_failed(payload, dead)
end
