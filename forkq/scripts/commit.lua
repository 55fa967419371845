-- commit.lua: commit a batch (forkq/batches.py): the last command of the transaction that
-- wrote its record, its members and their jobs. From now on its callbacks may fire; any
-- that its state calls for already (an empty batch, a batch reopened after its members
-- all ran) fire in this step (settle in workflow.lua).
--
-- ARGV[1]  the bid
--
-- Returns 1, or 0 when forkq:batch:<bid> is no hash (expired, or of another type): nothing
-- is changed then.
local meta = batch_key(ARGV[1])
if redis.call("TYPE", meta)["ok"] ~= "hash" then
  return 0
end
redis.call("HSET", meta, "committed", "1")
settle(ARGV[1])
return 1
