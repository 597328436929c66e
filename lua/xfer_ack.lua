-- Flashgate transfer, closing: once the target bucket holds the items of
-- transfer ARGV[1] (lua/xfer_in.lua answered), the donor bucket moves it
-- from open to done. The record is kept for the books until the sale's keys
-- expire. Idempotent.
--
-- KEYS[1] xfer-out  KEYS[2] xfer-open   (of the donor bucket D)
-- ARGV[1] transfer id
-- Reply: 1 closed now; 0 closed before, or unknown

if redis.call('ZREM', KEYS[2], ARGV[1]) == 0 then
  return 0
end
local r = redis.call('HGET', KEYS[1], ARGV[1])
if r then
  local d = cjson.decode(r)
  d.done = true
  redis.call('HSET', KEYS[1], ARGV[1], cjson.encode(d))
  redis.call('HINCRBY', KEYS[1], '#open', -d.n)
end
return 1
