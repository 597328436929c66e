-- Flashgate restore lock, freed: deletes the lock (KEYS[1]) only while it
-- still holds the restorer's token (ARGV[1]).
-- Answers 1 if freed, 0 if another holds it or it expired.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
