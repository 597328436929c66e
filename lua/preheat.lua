-- Flashgate preheat: installs a sale the backend rebuilt from the database,
-- in one step, only if the sale is absent and only by the holder of the
-- restore lock, so that neither a process restarting nor a restorer that
-- was overtaken (its lock expired while it worked, another restored the
-- sale, buyers bought) can ever reset a running sale.
--
-- The backend builds the buyers hash, the reservation index and the set of
-- returned items under scratch keys of its own (same hash tag); this script
-- renames them into place, or drops them when it refuses.
--
-- KEYS[1] meta       KEYS[2] remaining    KEYS[3] stream
-- KEYS[4] buyers     KEYS[5] resv         KEYS[6] released
-- KEYS[7] restoring (the lock)
-- KEYS[8] scratch buyers  KEYS[9] scratch resv  KEYS[10] scratch released
-- ARGV[1] name  ARGV[2] stock  ARGV[3] per_user_limit
-- ARGV[4] starts_at_ms  ARGV[5] ends_at_ms
-- ARGV[6] remaining to set (stock minus what the database holds as sold)
-- ARGV[7] consumer group name
-- ARGV[8] paused ('1' or '0', from the database)
-- ARGV[9] the lock token of the caller
-- ARGV[10..12] entries written to the scratch buyers, resv and released
-- Reply: 1 the sale was installed; 0 it was already there (nothing changed);
--       -2 the caller no longer holds the lock (nothing changed);
--       -3 a scratch key does not hold what was written (it expired: the
--          rebuild took far too long); nothing changed, restore again.

local function drop_scratch()
  redis.call('DEL', KEYS[8], KEYS[9], KEYS[10])
end

if redis.call('EXISTS', KEYS[1]) == 1 then
  drop_scratch()
  return 0
end
if redis.call('GET', KEYS[7]) ~= ARGV[9] then
  drop_scratch()
  return -2
end
local sizes = {redis.call('HLEN', KEYS[8]), redis.call('HLEN', KEYS[9]), redis.call('SCARD', KEYS[10])}
for i = 1, 3 do
  if sizes[i] ~= tonumber(ARGV[i + 9]) then
    drop_scratch()
    return -3
  end
end
for i = 4, 6 do
  local scratch = KEYS[i + 4]
  if redis.call('EXISTS', scratch) == 1 then
    redis.call('RENAME', scratch, KEYS[i])
    -- The scratch key expires so that a crashed restorer leaves nothing
    -- behind; RENAME carries that expiry over.
    redis.call('PERSIST', KEYS[i])
  else
    redis.call('DEL', KEYS[i])
  end
end
redis.call('HSET', KEYS[1], 'name', ARGV[1], 'stock', ARGV[2], 'per_user_limit', ARGV[3],
           'starts_at_ms', ARGV[4], 'ends_at_ms', ARGV[5], 'paused', ARGV[8])
redis.call('SET', KEYS[2], ARGV[6])
if redis.call('EXISTS', KEYS[3]) == 0 then
  redis.call('XGROUP', 'CREATE', KEYS[3], ARGV[7], '0', 'MKSTREAM')
end
return 1
