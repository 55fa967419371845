-- record.lua: the master's process record, busy hashes and remote signal (docs/sidekiq-wire.md §5).
--
-- KEYS[1]  processes         KEYS[2]  <identity>, the process hash
-- KEYS[3]  <identity>:workers   KEYS[4]  <identity>:work (the busy hashes, rebuilt)
-- KEYS[5]  <identity>-signals   KEYS[6]  forkq:beats:<identity>, the children's beats,
--          whose TTL (ARGV[1]) is renewed here (a child renews it only once its master died)
-- ARGV[1]  TTL of KEYS[2..4], seconds   ARGV[2]  how many field/value arguments follow
--          for KEYS[2]; they come first, then the busy entries' (thread, entry) pairs
--
-- The busy hashes are deleted first, whatever they hold (Sidekiq's readers rebuild them the
-- same way): a script whose first write frees memory may write on, so Redis at maxmemory
-- with noeviction still takes the record, and the daemon stays listed (Sidekiq's Busy page,
-- `forkq status`) instead of looking dead once the record's TTL ran out. A key of another
-- type is left alone and reported (its write fails, no type is asked on the way: this runs
-- every 5 s on every daemon); the rest is written. Returns {signal popped or false, key,
-- error, ...}.
local refused = {}
local function wrote(key, reply)  -- false, and the key reported, when the write failed
  if type(reply) == "table" and reply["err"] then
    table.insert(refused, key)
    table.insert(refused, reply["err"])
    return false
  end
  return true
end

redis.call("DEL", KEYS[3], KEYS[4])
local ttl = ARGV[1]
local fields = tonumber(ARGV[2])
wrote(KEYS[1], try("SADD", KEYS[1], KEYS[2]))
if wrote(KEYS[2], try("HSET", KEYS[2], unpack(ARGV, 3, 2 + fields))) then
  redis.call("EXPIRE", KEYS[2], ttl)
end
if #ARGV > 2 + fields then
  for i = 3, 4 do
    redis.call("HSET", KEYS[i], unpack(ARGV, 3 + fields))
    redis.call("EXPIRE", KEYS[i], ttl)
  end
end
redis.call("EXPIRE", KEYS[6], ttl)
local signal = try("RPOP", KEYS[5])
if not wrote(KEYS[5], signal) then
  signal = false
end
local reply = {signal}
for _, item in ipairs(refused) do
  table.insert(reply, item)
end
return reply
