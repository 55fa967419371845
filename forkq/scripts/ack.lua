-- ack.lua: acknowledge the job a processor completed while it holds more (a batch).
--
-- KEYS[1]  this processor's in-flight list: pairs {queue key, job, ...}
-- KEYS[2]  stat:processed            KEYS[3]  stat:processed:<UTC date>
-- ARGV[1]  the job completed          ARGV[2]  TTL in seconds of the daily stat key
--
-- If KEYS[1]'s first pair holds exactly ARGV[1], remove that pair and count the job
-- processed; returns 1, else 0 (already acknowledged: safe to send again). The processor
-- sends it without waiting for the reply before it starts its next held job, so the
-- acknowledgement is on its way to Redis before that job runs. Its first write is a pop.
if redis.call("LINDEX", KEYS[1], 1) ~= ARGV[1] then
  return 0
end
redis.call("LPOP", KEYS[1], 2)
try("INCR", KEYS[2])
try("INCR", KEYS[3])
try("EXPIRE", KEYS[3], ARGV[2])
return 1
