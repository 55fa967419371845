-- unlock.lua: release the lock of a unique job when it starts (unique_until: start).
--
-- ARGV[1]  the job JSON: its lock is released only while it holds the job's jid
--          (release_unique in guard.lua)
release_unique(ARGV[1])
return 1
