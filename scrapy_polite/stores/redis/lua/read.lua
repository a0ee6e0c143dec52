-- Reads the clock and rows, atomically. KEYS[1..n]: the rows; KEYS[n+1]: the update's idempotence record when
-- ARGV[1] is "1" (its value is returned, or false), else any key of the table's slot (routing on a cluster).
-- ARGV[2..]: the hash fields. Returns {seconds, microseconds, record or false, fields of each row...}.
local n = #KEYS - 1
local t = redis.call('TIME')
local out = {t[1], t[2], false}
if ARGV[1] == '1' then
  out[3] = redis.call('GET', KEYS[n + 1])
end
local names = {}
for k = 2, #ARGV do names[k - 1] = ARGV[k] end
for i = 1, n do
  out[#out + 1] = redis.call('HMGET', KEYS[i], unpack(names))
end
return out
