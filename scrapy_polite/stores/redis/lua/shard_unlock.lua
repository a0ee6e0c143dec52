-- Releases this token's locks on the rows of KEYS (ARGV[1]: the token); a lock-only row is deleted.
--!include release
for i = 1, #KEYS do
  if redis.call('HGET', KEYS[i], 'lk') == ARGV[1] then
    release(KEYS[i])
  end
end
return 1
