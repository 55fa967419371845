-- death.lua: count one death of a job whose processor died holding it (the master's settle).
--
-- KEYS[1]  forkq:kills:<jid>   ARGV[1]  its TTL, seconds
--
-- Returns the job's deaths so far, this one included (count_death in guard.lua: a key
-- holding anything but a count restarts at 1; works at maxmemory).
return count_death(KEYS[1], ARGV[1])
