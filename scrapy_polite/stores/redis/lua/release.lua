-- A fragment. release(key) drops the lock of a row (sharded); a lock-only row (no version: the row did not
-- exist when it was locked) is deleted.
local function release(key)
  if redis.call('HEXISTS', key, 'v') == 1 then
    redis.call('HDEL', key, 'lk', 'lx')
  else
    redis.call('DEL', key)
  end
end
