-- Writes the rows of ARGV if the update's idempotence record is absent and every row of KEYS still has the
-- version read; with the rows, sets the record. KEYS[1..n]: the rows read; KEYS[n+1]: the table's version
-- counter; KEYS[n+2]: the record. ARGV[1]: this attempt's number (the record's value); ARGV[2]: the record's
-- TTL (ms); ARGV[3..n+2]: the versions read ("0": absent); ARGV[n+3]: the number f of state fields, then their
-- f hash field names; then f + 2 values per row to write: its index in KEYS, its expiry (Unix ms, "0":
-- none) and its f field values. Returns the record's value (a string) when it was there (nothing written),
-- the clock and the current rows when a version changed (nothing written), else the new version (a number).
-- Generic: no pacing rule here, and no field name either.
--!include return_if_done
local n = #KEYS - 2
local f = tonumber(ARGV[n + 3])
local names = {}
for k = 1, f do names[k] = ARGV[n + 3 + k] end
for i = 1, n do
  local v = redis.call('HGET', KEYS[i], 'v')
  if (v or '0') ~= ARGV[i + 2] then
    local t = redis.call('TIME')
--!include return_current_rows
  end
end
local version = redis.call('INCR', KEYS[n + 1])
local function row_version(index)
  return version
end
local i = n + 4 + f
--!include write_rows
redis.call('SET', KEYS[n + 2], ARGV[1], 'PX', ARGV[2])
return version
