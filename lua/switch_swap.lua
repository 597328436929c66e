-- Flashgate switch sync: sets KEYS[1] to ARGV[2] only while it still holds
-- ARGV[1], what the caller read, so a sync never writes over a value an
-- operator wrote after that read. Answers 1 if set, else 0.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2])
  return 1
end
return 0
