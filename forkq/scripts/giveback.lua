-- giveback.lua: a processor gives back the jobs it holds without having started them
-- (a graceful stop or quiet, while it finishes the job it runs); caller:
-- forkq/daemon/children/processor.py.
--
-- KEYS[1]  this processor's in-flight list: pairs {queue key, job, ...}
-- ARGV[1..n] the jobs held, not started, in the order they were to run: the last n pairs
--
-- If the last n pairs of KEYS[1] hold exactly ARGV[1..n], they leave KEYS[1] and each job
-- goes back unchanged to the right end (the front) of its queue, the first held nearest
-- the front: the order they were fetched in. Returns n, or 0 when KEYS[1] does not end
-- with them (changed nothing). Refuses, changing nothing, when a queue holds another
-- type. The trim is the first write: at maxmemory (noeviction) it goes through.
local n = #ARGV
local tail = redis.call("LRANGE", KEYS[1], -2 * n, -1)
if #tail ~= 2 * n then
  return 0
end
for i = 1, n do
  if tail[2 * i] ~= ARGV[i] then
    return 0
  end
end
for i = 1, n do
  local bad = wrong_type(queue_key(tail[2 * i - 1]), "list")
  if bad then
    return redis.error_reply(bad)
  end
end
redis.call("LTRIM", KEYS[1], 0, -(2 * n) - 1)
for i = 1, n do
  release_slot(tail[2 * i])  -- not started: its concurrency slot goes
end
for i = n, 1, -1 do
  redis.call("RPUSH", queue_key(tail[2 * i - 1]), tail[2 * i])
end
return n
