-- Flashgate preheat of one bucket of a bucketed sale (buckets > 1): its
-- meta (a copy of the sale's definition, plus `bucket` and `buckets`, so a
-- deduct on the bucket reads everything in its slot), its share of the
-- stock, its stream's consumer group, and its `synced` mark. Only if the
-- bucket is absent: a present one is never reset.
--
-- Installed only for a sale without orders (backend/src/buckets.rs): with
-- nothing sold, the bucket agrees with the database by construction, so it
-- is marked synced with this Redis's replication id at once. A bucket whose
-- Redis later fails over is fenced (the deduct answers "fenced") until
-- phase 2 of bucketed stock adds its re-sync.
--
-- KEYS[1] meta  KEYS[2] remaining  KEYS[3] stream  KEYS[4] synced
-- ARGV[1] name  ARGV[2] this bucket's share of the stock  ARGV[3] per_user_limit
-- ARGV[4] starts_at_ms  ARGV[5] ends_at_ms  ARGV[6] paused ("1" or "0")
-- ARGV[7] bucket  ARGV[8] buckets  ARGV[9] consumer group
-- The replication id is fg_replid (lua/lib/replid.lua, prepended).
-- Reply: 1 installed; 0 already there (nothing changed)

if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
local created = redis.pcall('XGROUP', 'CREATE', KEYS[3], ARGV[9], '0', 'MKSTREAM')
if type(created) == 'table' and created.err and not string.find(created.err, 'BUSYGROUP', 1, true) then
  return redis.error_reply(created.err)
end
redis.call('HSET', KEYS[1], 'name', ARGV[1], 'stock', ARGV[2], 'per_user_limit', ARGV[3],
           'starts_at_ms', ARGV[4], 'ends_at_ms', ARGV[5], 'paused', ARGV[6],
           'bucket', ARGV[7], 'buckets', ARGV[8])
redis.call('SET', KEYS[2], ARGV[2])
redis.call('SET', KEYS[4], fg_replid())
return 1
