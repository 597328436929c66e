-- Flashgate: writes fields into a present meta hash (a bucketed sale's
-- bucket copy of its definition: pause, window, name, limit), never
-- creating one, so a bucket the backend has not installed stays absent.
--
-- KEYS[1] meta
-- ARGV field, value, field, value, ...
-- Reply: 1 written; 0 the hash is absent (nothing changed)

if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
redis.call('HSET', KEYS[1], unpack(ARGV))
return 1
