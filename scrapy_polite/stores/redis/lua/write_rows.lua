-- A fragment. Writes the rows of ARGV from index i on, f + 2 values per row: its index in KEYS, its expiry
-- (Unix ms, "0": none) and its f field values (names), with the version row_version(index) (each script
-- defines it).
while i <= #ARGV do
  local index = tonumber(ARGV[i])
  local key = KEYS[index]
  local pairs = {'v', row_version(index)}
  for k = 1, f do
    pairs[#pairs + 1] = names[k]
    pairs[#pairs + 1] = ARGV[i + 1 + k]
  end
  redis.call('HSET', key, unpack(pairs))
  if ARGV[i + 1] == '0' then
    redis.call('PERSIST', key)
  else
    redis.call('PEXPIREAT', key, ARGV[i + 1])
  end
  i = i + 2 + f
end
