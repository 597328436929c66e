-- Flashgate preheat: load a sale into Redis only if it is absent, so that
-- restarting any process never resets a running sale.
--
-- KEYS[1] meta       KEYS[2] remaining    KEYS[3] stream
-- ARGV[1] name  ARGV[2] stock  ARGV[3] per_user_limit
-- ARGV[4] starts_at_ms  ARGV[5] ends_at_ms
-- ARGV[6] remaining to set (stock minus orders the database already holds)
-- ARGV[7] consumer group name
-- Reply: 1 when the sale was loaded, 0 when it was already there.

if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
redis.call('HSET', KEYS[1], 'name', ARGV[1], 'stock', ARGV[2], 'per_user_limit', ARGV[3],
           'starts_at_ms', ARGV[4], 'ends_at_ms', ARGV[5], 'paused', '0')
redis.call('SET', KEYS[2], ARGV[6])
if redis.call('EXISTS', KEYS[3]) == 0 then
  redis.call('XGROUP', 'CREATE', KEYS[3], ARGV[7], '0', 'MKSTREAM')
end
return 1
