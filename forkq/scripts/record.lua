-- record.lua: the master's process record, busy hashes and remote signal (docs/sidekiq-wire.md §5).
--
-- KEYS[1]  processes         KEYS[2]  <identity>, the process hash
-- KEYS[3]  <identity>:workers   KEYS[4]  <identity>:work (the busy hashes, rebuilt)
-- KEYS[5]  <identity>-signals
-- ARGV[1]  TTL of KEYS[2..4], seconds   ARGV[2]  how many field/value arguments follow
--          for KEYS[2]; they come first, then the busy entries' (thread, entry) pairs
--
-- The busy hashes are deleted first, whatever they hold (Sidekiq's readers rebuild them the
-- same way): a script whose first write frees memory may write on, so Redis at maxmemory
-- with noeviction still takes the record, and the daemon stays listed (Sidekiq's Busy page,
-- `forkq status`) instead of looking dead once the record's TTL ran out. A key of another type is left alone
-- and reported; the rest is written. Returns {signal popped or false, key, error, ...}.
local refused = {}
local function fits(key, kind)
  local bad = wrong_type(key, kind)
  if bad then
    table.insert(refused, key)
    table.insert(refused, bad)
  end
  return not bad
end

redis.call("DEL", KEYS[3], KEYS[4])
local ttl = ARGV[1]
local fields = tonumber(ARGV[2])
if fits(KEYS[1], "set") then
  redis.call("SADD", KEYS[1], KEYS[2])
end
if fits(KEYS[2], "hash") then
  redis.call("HSET", KEYS[2], unpack(ARGV, 3, 2 + fields))
  redis.call("EXPIRE", KEYS[2], ttl)
end
if #ARGV > 2 + fields then
  for i = 3, 4 do
    redis.call("HSET", KEYS[i], unpack(ARGV, 3 + fields))
    redis.call("EXPIRE", KEYS[i], ttl)
  end
end
local signal = false
if fits(KEYS[5], "list") then
  signal = redis.call("RPOP", KEYS[5])
end
local reply = {signal}
for _, item in ipairs(refused) do
  table.insert(reply, item)
end
return reply
