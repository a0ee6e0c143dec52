-- A fragment. A lost race (n rows in KEYS, the clock t, the state fields names): returns the clock and every
-- row's version and fields, on which the caller decides again.
local out = {t[1], t[2]}
for j = 1, n do
  out[#out + 1] = redis.call('HMGET', KEYS[j], 'v', unpack(names))
end
return out
