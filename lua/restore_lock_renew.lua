-- Flashgate restore lock, renewed: extends the lock (KEYS[1]) by ARGV[2]
-- ms only while it still holds the restorer's token (ARGV[1]).
-- Answers 1 if renewed, 0 if another holds it or it expired.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
