-- Locks and reads an update's rows in one slot (the first phase of an update whose rows span slots).
-- KEYS[1..n]: the rows; KEYS[n+1]: the update's record in that slot. ARGV[1]: the token; ARGV[2]: the lease
-- (ms); ARGV[3..]: the hash fields to read ("v" first). Returns the record's value when it is there (nothing
-- locked); {0, seconds, µs} when a row holds a live lock of another update (nothing locked); else every row
-- is locked by this token until the lease ends (a lock-only row is created for an absent one, expiring with
-- its lease) and {1, seconds, µs, fields of each row...}.
--!include return_if_done
local n = #KEYS - 1
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[2])
for i = 1, n do
  local row = redis.call('HMGET', KEYS[i], 'lk', 'lx')
  if row[1] and row[1] ~= ARGV[1] and tonumber(row[2] or '0') > now_ms then
    return {0, t[1], t[2]}
  end
end
local names = {}
for k = 3, #ARGV do names[k - 2] = ARGV[k] end
local out = {1, t[1], t[2]}
for i = 1, n do
  local existed = redis.call('EXISTS', KEYS[i])
  redis.call('HSET', KEYS[i], 'lk', ARGV[1], 'lx', string.format('%d', now_ms + lease))
  if existed == 0 then
    redis.call('PEXPIRE', KEYS[i], 2 * lease)
  end
  out[#out + 1] = redis.call('HMGET', KEYS[i], unpack(names))
end
return out
