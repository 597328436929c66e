-- Flashgate transfer, receiving side: adds the items of transfer ARGV[1]
-- to bucket K, once whatever the number of calls (the gateway that took
-- them, its retry, and the backend's transit repair may all call it).
--
-- KEYS[1] meta  KEYS[2] remaining  KEYS[3] xfer-in   (of the target bucket K)
-- ARGV[1] transfer id  ARGV[2] items  ARGV[3] donor bucket D
-- The record is `{"from":D,"n":items}` (JSON): naming the donor lets the
-- re-sync of a failed-over bucket find the transfers whose donor-side
-- record its Redis lost (backend/src/fence/bucketed.rs).
-- Reply: 1 added now; 0 added before (nothing changed); -1 the bucket is
--        not in Redis (nothing changed: the transfer stays open and the
--        repair tries again)

if redis.call('EXISTS', KEYS[1]) == 0 then
  return -1
end
local n = tonumber(ARGV[2])
local record = cjson.encode({from = tonumber(ARGV[3]), n = n})
if redis.call('HSETNX', KEYS[3], ARGV[1], record) == 0 then
  return 0
end
redis.call('INCRBY', KEYS[2], n)
return 1
