-- A fragment (pasted where a script says "--!include return_if_done", so the script still runs atomically).
-- The update's idempotence record is the last of KEYS in every script that writes: when it is there, the
-- update was applied, nothing is done and its value (the attempt's number) is returned.
local done = redis.call('GET', KEYS[#KEYS])
if done then
  return done
end
