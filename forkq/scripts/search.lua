-- search.lua: the elements of one window of a list that contain a string (read only).
--
-- KEYS[1]  a list (a queue, or an in-flight list)
-- ARGV[1]  the string to look for, compared byte for byte (no pattern)
-- ARGV[2]  the first index of the window (from the left end, 0-based)
-- ARGV[3]  the size of the window
--
-- Returns {length of the list, index, element, index, element, ...}: each element of
-- [ARGV[2], ARGV[2] + ARGV[3] - 1] holding ARGV[1], with its index. The caller pages from
-- the left, so the server is held for one window at a time and only the matches cross the
-- wire; a key that does not exist is an empty list. Refuses, as any read would, when the
-- key holds another type.
local bad = wrong_type(KEYS[1], "list")
if bad then
  return redis.error_reply(bad)
end
local first = tonumber(ARGV[2])
local window = redis.call("LRANGE", KEYS[1], first, first + tonumber(ARGV[3]) - 1)
local found = {redis.call("LLEN", KEYS[1])}
for i, element in ipairs(window) do
  if string.find(element, ARGV[1], 1, true) then
    found[#found + 1] = first + i - 1
    found[#found + 1] = element
  end
end
return found
