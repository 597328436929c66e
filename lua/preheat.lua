-- Flashgate preheat: installs a sale the backend rebuilt from the database,
-- in one step, only if the sale is absent and only by the holder of the
-- restore lock, so that neither a process restarting nor a restorer that
-- was overtaken (its lock expired while it worked, another restored the
-- sale, buyers bought) can ever reset a running sale.
--
-- The sale is installed paused: the backend then counts orders written
-- while it rebuilt the sale and only after that applies the pause the
-- database holds, so no buy can happen before either. It is installed
-- fenced too (without `synced`): it sells only once a re-sync, which holds
-- the sale's row against order writes, has counted every order
-- (backend/src/fence.rs).
--
-- The backend builds the buyers hash, the reservation index and the set of
-- returned items under scratch keys of its own (same hash tag); this script
-- renames them into place, or drops them when it refuses.
--
-- KEYS[1] meta       KEYS[2] remaining    KEYS[3] stream
-- KEYS[4] buyers     KEYS[5] resv         KEYS[6] released
-- KEYS[7] restoring (the lock)
-- KEYS[8] scratch buyers  KEYS[9] scratch resv  KEYS[10] scratch released
-- KEYS[11] synced (deleted: the installed sale is fenced until re-synced)
-- ARGV[1] name  ARGV[2] stock  ARGV[3] per_user_limit
-- ARGV[4] starts_at_ms  ARGV[5] ends_at_ms
-- ARGV[6] remaining to set (stock minus what the database holds as sold)
-- ARGV[7] consumer group name
-- ARGV[8] the lock token of the caller
-- ARGV[9..11] entries written to the scratch buyers, resv and released
-- ARGV[12] draw_window_ms, the sale's own draw window ("" or absent: none,
--          the sale follows `[fairness] window_ms`)
-- ARGV[13] buckets, for a bucketed sale (absent or "": one bucket): its
--          buckets are installed first (lua/preheat_bucket.lua) and this
--          meta then names their count; the sale's own `remaining` is 0
--          and its own keys stay fenced, so nothing sells from them
-- ARGV[14] checkout_url, the sale's checkout template ("" or absent: none;
--          docs/CHECKOUT.md)
-- Reply: 1 the sale was installed (paused); 0 it was already there (nothing
--       changed); -2 the caller no longer holds the lock (nothing changed);
--       -3 a scratch key does not hold what was written (it expired: the
--          rebuild took far too long); nothing changed, restore again.

local function drop_scratch()
  redis.call('DEL', KEYS[8], KEYS[9], KEYS[10])
end

if redis.call('EXISTS', KEYS[1]) == 1 then
  drop_scratch()
  return 0
end
if redis.call('GET', KEYS[7]) ~= ARGV[8] then
  drop_scratch()
  return -2
end
local sizes = {redis.call('HLEN', KEYS[8]), redis.call('HLEN', KEYS[9]), redis.call('SCARD', KEYS[10])}
for i = 1, 3 do
  if sizes[i] ~= tonumber(ARGV[i + 8]) then
    drop_scratch()
    return -3
  end
end
-- The stream may have survived, with or without its group: create the group
-- either way and let an existing one stand. First of the writes, so that a
-- stream key Redis refuses leaves everything else unchanged.
local created = redis.pcall('XGROUP', 'CREATE', KEYS[3], ARGV[7], '0', 'MKSTREAM')
if type(created) == 'table' and created.err and not string.find(created.err, 'BUSYGROUP', 1, true) then
  drop_scratch()
  return redis.error_reply(created.err)
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
           'starts_at_ms', ARGV[4], 'ends_at_ms', ARGV[5], 'paused', '1')
if ARGV[12] and ARGV[12] ~= '' then
  redis.call('HSET', KEYS[1], 'draw_window_ms', ARGV[12])
end
if ARGV[13] and ARGV[13] ~= '' then
  redis.call('HSET', KEYS[1], 'buckets', ARGV[13])
end
if ARGV[14] and ARGV[14] ~= '' then
  redis.call('HSET', KEYS[1], 'checkout_url', ARGV[14])
end
redis.call('SET', KEYS[2], ARGV[6])
redis.call('DEL', KEYS[11])
-- A restored sale's stock epoch starts past any of the sale it replaces
-- that a gateway may still hold (lua/lib/epoch.lua).
fg_bump_epoch(KEYS[1])
return 1
