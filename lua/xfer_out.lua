-- Flashgate transfer, donor side: takes a batch of items out of bucket D of
-- a bucketed sale for bucket K, and records the transfer as open, so the
-- items stay visible in the books while in transit and a crash before the
-- other side (lua/xfer_in.lua) is repaired by the backend.
--
-- KEYS[1] meta  KEYS[2] remaining  KEYS[3] xfer-out  KEYS[4] xfer-open
-- KEYS[5] synced                     (all of the donor bucket D)
-- ARGV[1] transfer id (made by the caller, unique per transfer)
-- ARGV[2] target bucket K
-- ARGV[3] most items to move
-- ARGV[4] "1" when K is D itself (the caller's own bucket, asked first in
--         case its items are in transit elsewhere)
-- Prepended: lua/lib/replid.lua (fg_replid) and lua/lib/time.lua (fg_now_ms).
-- Reply: {outcome, detail}
--   "moved"       items taken (ceil(remaining / 2), at most ARGV[3]); a
--                 retry with the same transfer id answers the same count
--                 and takes nothing more (how the transit repair learns
--                 the replication id of a recorded take). A third
--                 element: this Redis's replication id, which the give
--                 carries (the token fence of lua/xfer_in.lua), and for
--                 which a gateway with `redis.wait_replicas` waits for the
--                 take to reach replicas of this very master
--   "empty"       ""  nothing left and no transfer out of D open
--   "in_transit"  target bucket of the oldest open transfer out of D, and
--                 three more elements: its transfer id, its items and
--                 this Redis's replication id (what its give carries,
--                 lua/xfer_in.lua). D has
--                 nothing left, but items are on their way there; any
--                 caller may complete that transfer (lua/xfer_in.lua, then
--                 lua/xfer_ack.lua: both idempotent)
--   "not_found"   ""  the bucket is not in Redis
--   "stocked"     ""  K is D and D holds items: nothing taken (no
--                 transfer to itself), the caller deducts again
--   "fenced"      ""  the bucket's Redis became a master since it was
--                 installed: its count may lack the last writes, so
--                 nothing is taken from it (backend/src/fence.rs)

local rec = redis.call('HGET', KEYS[3], ARGV[1])
if rec then
  return {'moved', tostring(cjson.decode(rec).n), fg_replid()}
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {'not_found', ''}
end
if redis.call('GET', KEYS[5]) ~= fg_replid() then
  return {'fenced', ''}
end
local left = tonumber(redis.call('GET', KEYS[2]) or '0')
if left <= 0 then
  local open = redis.call('ZRANGE', KEYS[4], 0, 0)
  if open[1] then
    local r = redis.call('HGET', KEYS[3], open[1])
    if r then
      local d = cjson.decode(r)
      return {'in_transit', tostring(d.to), open[1], tostring(d.n), fg_replid()}
    end
  end
  return {'empty', ''}
end
if ARGV[4] == '1' then
  return {'stocked', ''}
end
local t = math.min(tonumber(ARGV[3]), math.ceil(left / 2))
local now = fg_now_ms()
redis.call('DECRBY', KEYS[2], t)
redis.call('HSET', KEYS[3], ARGV[1], cjson.encode({to = tonumber(ARGV[2]), n = t, at = now, done = false}))
redis.call('HINCRBY', KEYS[3], '#open', t)
redis.call('ZADD', KEYS[4], now, ARGV[1])
return {'moved', tostring(t), fg_replid()}
