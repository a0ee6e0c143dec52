-- The sharded layout (?layout=sharded): one hash tag per row, so a multi-row update may span slots.
-- Writes an update's rows in one slot, once. KEYS[1..n]: the rows of the slot; KEYS[n+1]: the update's
-- idempotence record in that slot. ARGV[1]: the attempt's number; ARGV[2]: the record's TTL (ms); ARGV[3]: the
-- update's token; ARGV[4]: "w" (optimistic) or "c" (the write of a locked update); ARGV[5..n+4]: the versions
-- read. Every row must still have the version read and no live lock of another update (a row locked by this
-- token since the read cannot have changed; the version check also covers a lock that was lost). ARGV[n+5]:
-- the number f of state fields, their names, then f + 2 values per row to write as in write_if_unchanged.
-- A row's new version is max(its version + 1, the server's clock in µs): it only grows, even across a delete.
-- Every row of KEYS loses its lock (a lock-only row is deleted). Returns the record's value when it was there,
-- the clock and the current rows when a version changed or a row is locked ("w"), 0 then ("c"), else 1.
--!include return_if_done
--!include release
local n = #KEYS - 1
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_ms = math.floor(now_us / 1000)
local f = tonumber(ARGV[n + 5])
local names = {}
for k = 1, f do names[k] = ARGV[n + 5 + k] end
local versions = {}
for i = 1, n do
  local row = redis.call('HMGET', KEYS[i], 'v', 'lk', 'lx')
  versions[i] = tonumber(row[1] or '0')
  local foreign = row[2] and row[2] ~= ARGV[3] and tonumber(row[3] or '0') > now_ms
  if (row[1] or '0') ~= ARGV[i + 4] or foreign then
    if ARGV[4] == 'c' then
      return 0
    end
--!include return_current_rows
  end
end
local function row_version(index)
  return string.format('%d', math.max(versions[index] + 1, now_us))
end
local i = n + 6 + f
--!include write_rows
for j = 1, n do
  if redis.call('HGET', KEYS[j], 'lk') then
    release(KEYS[j])
  end
end
redis.call('SET', KEYS[n + 1], ARGV[1], 'PX', ARGV[2])
return 1
