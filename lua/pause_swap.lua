-- Flashgate pause sync: sets a present sale's pause (meta hash KEYS[1]) to
-- ARGV[2] only while it still holds ARGV[1], what the caller read, and no
-- restore other than the caller's (ARGV[3], its lock token) holds the
-- sale's restore lock (KEYS[2]): a restore applies the recorded pause
-- itself. Answers 1 if set, else 0.
local lock = redis.call('GET', KEYS[2])
if lock and lock ~= ARGV[3] then
  return 0
end
if redis.call('HGET', KEYS[1], 'paused') ~= ARGV[1] then
  return 0
end
redis.call('HSET', KEYS[1], 'paused', ARGV[2])
return 1
