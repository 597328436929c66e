-- Flashgate buyers read: the buyers of a one-bucket sale that a gateway
-- holds flagged sold out without its own script having found it so (the
-- flag was announced by another gateway), proven complete as the deduct's
-- own `sold_out` is (lua/lib/deduct.lua, lua/lib/decide.lua `fg_take`):
-- not fenced (the sale's `synced` is this Redis's replication id) and no
-- item left; and, which the deduct need not ask, the sale is here and has
-- one bucket (a bucket's stock is in keys of its own). A win after this
-- read needs an item back first, which moves the stock epoch
-- (lua/lib/epoch.lua), so the gateway keeps the buyers only while a later
-- read of the same proof finds the same epoch (gateway/src/sales/cache.rs,
-- `SaleCache::read_buyers`).
--
-- KEYS[1] meta  KEYS[2] remaining  KEYS[3] resv  KEYS[4] synced
-- ARGV[1] "1" to answer the buyers too; "" for the proof alone (a renewal
--         of buyers read before)
-- ARGV[2] most buyers answered
-- Reply: {"proven", epoch, user, user, ...} (the users of `resv`, returned
--        ones included, only when asked); {"too_many", epoch} when `resv`
--        holds more than ARGV[2]; {"unproven", ""} when any rule fails.
-- The replication id is fg_replid (lua/lib/replid.lua, prepended).

if redis.call('EXISTS', KEYS[1]) == 0 then
  return {'unproven', ''}
end
local meta = redis.call('HMGET', KEYS[1], 'epoch', 'buckets')
local left = tonumber(redis.call('GET', KEYS[2]) or '')
if not left or left > 0 or (tonumber(meta[2] or '1') or 0) ~= 1
    or redis.call('GET', KEYS[4]) ~= fg_replid() then
  return {'unproven', ''}
end
local epoch = meta[1] or '0'
if ARGV[1] ~= '1' then
  return {'proven', epoch}
end
if redis.call('HLEN', KEYS[3]) > tonumber(ARGV[2]) then
  return {'too_many', epoch}
end
local reply = {'proven', epoch}
for _, user in ipairs(redis.call('HVALS', KEYS[3])) do
  reply[#reply + 1] = user
end
return reply
