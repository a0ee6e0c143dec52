-- Deletes each row of KEYS whose version is still ARGV[i]; returns how many it deleted.
local deleted = 0
for i = 1, #KEYS do
  if redis.call('HGET', KEYS[i], 'v') == ARGV[i] then
    deleted = deleted + redis.call('DEL', KEYS[i])
  end
end
return deleted
