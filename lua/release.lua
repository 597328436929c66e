-- Flashgate stock return: gives back the item of one cancelled reservation,
-- at most once whatever the number of calls, and frees the buyer's slot
-- under the per-user limit.
--
-- KEYS[1] meta  KEYS[2] remaining  KEYS[3] buyers  KEYS[4] released
-- ARGV[1] reservation id  ARGV[2] user id
-- All keys share the sale's hash tag.
-- Reply: 1 the item went back now; 0 it had already gone back;
--       -1 the sale is not in Redis (it is being restored: call again later,
--          the restore counts only orders that are not cancelled).

if redis.call('EXISTS', KEYS[1]) == 0 then
  return -1
end
if redis.call('SADD', KEYS[4], ARGV[1]) == 0 then
  return 0
end
redis.call('INCR', KEYS[2])
local left = redis.call('HINCRBY', KEYS[3], ARGV[2], -1)
if left <= 0 then
  redis.call('HDEL', KEYS[3], ARGV[2])
end
return 1
