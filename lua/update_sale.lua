-- Flashgate sale update by an operator: change a preheated sale's metadata
-- and move its remaining stock by the change in total stock, atomically, so
-- no item already sold is sold again.
--
-- KEYS[1] meta       KEYS[2] remaining
-- KEYS[3] synced (optional): given, a stock change on a sale fenced after
--         a failover (`synced` is not this Redis's replication id, see
--         lua/fence.lua) is refused with {-3, 0}: its count may lack the
--         last deducts, so the check against what is sold would be wrong.
--         The re-sync itself passes no KEYS[3]: it applies the definition
--         after counting the orders, before it lifts the fence.
-- ARGV[1] name  ARGV[2] stock  ARGV[3] per_user_limit
-- ARGV[4] starts_at_ms  ARGV[5] ends_at_ms
-- ARGV[6] draw_window_ms, the sale's own draw window ("": none, the sale
--         follows `[fairness] window_ms`; absent: left as it is)
-- ARGV[7] the sale's bucket count as the caller knows it
-- ARGV[8] checkout_url, the sale's checkout template ("": none; absent:
--         left as it is; docs/CHECKOUT.md)
-- A bucketed sale (its meta's `buckets` > 1) sells from its buckets, whose
-- bases the backend moved before (backend/src/buckets/stock.rs): only the
-- definition is written here, its own `remaining` stays 0, and the reply is
-- {1, 0}.
-- Reply: {1, remaining} when updated; {0, sold} when the new stock is below
-- the items already sold (nothing changes); {-1, 0} when the sale is absent;
-- {-2, buckets} when Redis holds the sale with another bucket count
-- (nothing changes: gateways find the items by that count); {-3, 0} when
-- the stock changes on a fenced sale (KEYS[3] given; nothing changes).
-- Prepended: lua/lib/replid.lua (fg_replid), lua/lib/time.lua and
-- lua/lib/epoch.lua (fg_bump_epoch).

local old = redis.call('HGET', KEYS[1], 'stock')
if not old then
  return {-1, 0}
end
local held = tonumber(redis.call('HGET', KEYS[1], 'buckets') or '1')
if ARGV[7] and tonumber(ARGV[7]) ~= held then
  return {-2, held}
end
local function definition()
  redis.call('HSET', KEYS[1], 'name', ARGV[1], 'stock', ARGV[2], 'per_user_limit', ARGV[3],
             'starts_at_ms', ARGV[4], 'ends_at_ms', ARGV[5])
  if ARGV[6] == '' then
    redis.call('HDEL', KEYS[1], 'draw_window_ms')
  elseif ARGV[6] then
    redis.call('HSET', KEYS[1], 'draw_window_ms', ARGV[6])
  end
  if ARGV[8] == '' then
    redis.call('HDEL', KEYS[1], 'checkout_url')
  elseif ARGV[8] then
    redis.call('HSET', KEYS[1], 'checkout_url', ARGV[8])
  end
end
if held > 1 then
  definition()
  return {1, 0}
end
local stock = tonumber(ARGV[2])
if KEYS[3] and stock ~= tonumber(old) and
   redis.call('GET', KEYS[3]) ~= fg_replid() then
  return {-3, 0}
end
local left = tonumber(redis.call('GET', KEYS[2]) or '0')
local sold = tonumber(old) - left
if stock < sold then
  return {0, sold}
end
definition()
redis.call('SET', KEYS[2], stock - sold)
-- Items may have come back: a newer stock epoch (lua/lib/epoch.lua).
fg_bump_epoch(KEYS[1])
return {1, stock - sold}
