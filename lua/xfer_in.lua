-- Flashgate transfer, receiving side: adds the items of transfer ARGV[1]
-- to bucket K, once whatever the number of calls (the gateway that took
-- them, its retry, and the backend's transit repair may all call it).
--
-- KEYS[1] meta  KEYS[2] remaining  KEYS[3] xfer-in  KEYS[4] xfer-refuse
--                                                     (of the target bucket K)
-- ARGV[1] transfer id  ARGV[2] items  ARGV[3] donor bucket D
-- ARGV[4] replication id of D's Redis where the take ran (lua/xfer_out.lua
--         answers it)
-- The record is `{"from":D,"n":items}` (JSON): naming the donor lets the
-- re-sync of a failed-over bucket find the transfers whose donor-side
-- record its Redis lost (backend/src/fence/bucketed.rs).
-- The token fence: once D's re-sync has read K's transfers, it has put
-- "D:<replication id D was synced on>" in K's `xfer-refuse`; a give of a
-- take made on that old Redis of D arriving later is refused, so the
-- re-sync never misses an add it did not see (it would count it twice).
-- Reply: 1 added now; 0 added before (nothing changed); -1 the bucket is
--        not in Redis; -2 refused: the take ran on a Redis of D that D's
--        re-sync has fenced off (nothing changed: the transfer stays open
--        wherever its record survived, and the repair gives it again from
--        there, with that Redis's replication id)

if redis.call('EXISTS', KEYS[1]) == 0 then
  return -1
end
if redis.call('HEXISTS', KEYS[3], ARGV[1]) == 1 then
  return 0
end
if redis.call('SISMEMBER', KEYS[4], ARGV[3] .. ':' .. ARGV[4]) == 1 then
  return -2
end
local n = tonumber(ARGV[2])
redis.call('HSET', KEYS[3], ARGV[1], cjson.encode({from = tonumber(ARGV[3]), n = n}))
redis.call('INCRBY', KEYS[2], n)
return 1
