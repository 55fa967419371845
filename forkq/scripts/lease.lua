-- lease.lua: the scheduler leader's lease; acquire, renew or release, only as its owner.
--
-- KEYS[1]  forkq:leader: the owner token of the current term, with a TTL
-- KEYS[2]  dear-leader: the leader's process identity, for Sidekiq's Web UI (a mirror)
-- ARGV[1]  "acquire" | "renew" | "release"
-- ARGV[2]  the caller's owner token (new for every term)
-- ARGV[3]  the lease TTL in milliseconds
-- ARGV[4]  the caller's process identity (mirrored into KEYS[2])
-- ARGV[5]  the channel a release is published on (forkq:leader-released)
--
-- acquire: SET PX when KEYS[1] is free; renew: PEXPIRE, only if KEYS[1] still holds ARGV[2]; release:
-- DEL, only then too. Returns 1 on success, 0 when the lease is someone else's (or
-- nobody's, for renew and release). The mirror is written only when it is absent or
-- already ours, so a Sidekiq Enterprise leader sharing the Redis keeps its badge.
-- KEYS[1] is forkq's own: when it holds another type than a string, nobody holds the
-- lease, and acquire replaces it (returning 2, so that the caller reports it).
local op, token, ttl, identity = ARGV[1], ARGV[2], ARGV[3], ARGV[4]

local function mirror(show)
  local shown = try("GET", KEYS[2])
  if type(shown) == "table" then  -- not a string: not ours to touch
    return
  end
  if show and shown == identity then
    redis.call("PEXPIRE", KEYS[2], ttl)
  elseif show and not shown then
    redis.call("SET", KEYS[2], identity, "PX", ttl)
  elseif not show and shown == identity then
    redis.call("DEL", KEYS[2])
  end
end

if op == "acquire" then
  local held = redis.call("TYPE", KEYS[1])["ok"]
  if held == "string" then
    return 0
  end
  -- free (or of another type): the delete comes first, so Redis at maxmemory with
  -- noeviction lets the SET through (a script that has written may write on)
  redis.call("DEL", KEYS[1])
  redis.call("SET", KEYS[1], token, "PX", ttl)
  mirror(true)
  return held == "none" and 1 or 2
end
if try("GET", KEYS[1]) ~= token then  -- another term, none, or a key of another type
  return 0
end
if op == "renew" then
  redis.call("PEXPIRE", KEYS[1], ttl)
  mirror(true)
else
  redis.call("DEL", KEYS[1])
  mirror(false)
  redis.call("PUBLISH", ARGV[5], token)
end
return 1
