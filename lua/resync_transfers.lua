-- Flashgate bucket re-sync, transfers: makes bucket K of a bucketed sale,
-- whose Redis failed over and may lack its last writes, agree with the
-- transfer records the other buckets hold, and applies a change of its
-- base stock its Redis lost (backend/src/fence/bucketed.rs). Idempotent:
-- a transfer K already records is left as it is.
--
-- KEYS[1] meta  KEYS[2] remaining  KEYS[3] xfer-out  KEYS[4] xfer-in
-- KEYS[5] resv  KEYS[6] released                (all of the bucket K)
-- ARGV[1] change of K's base stock (the database's stock minus the sum of
--         every bucket's base; 0 almost always)
-- ARGV[2] m: how many triples of the first list follow
-- ARGV[3 ..] first m triples: transfer id, donor bucket X, items: every
--         transfer into K that its donor X records, done or still open.
--         One K's `xfer-in` lacks is recorded (`{"from":X,"n":t}`) and its
--         items added to `remaining`: K lost the add, or its give has not
--         run yet (the later give then finds it recorded: a no-op).
-- then triples: transfer id, target bucket Y, items: every record of
--         another bucket's `xfer-in` whose donor is K. One K's `xfer-out`
--         lacks, K lost the take: it is recorded as done (never open:
--         its items have arrived) and its items taken from `remaining`.
-- Reply: {this Redis's replication id, transfers added now, takes
--         recorded now, status, remaining, sold, base change applied},
--         status 1 done; 0 `remaining` is negative once the transfers and
--         a raise of the base are counted (the caller covers the shortfall
--         from the other buckets and calls again with the change less what
--         was applied; a cut is not applied); -1 the bucket is not in
--         Redis (nothing changed). A raise is always applied, before the
--         test; a cut only as far as `remaining` stays >= 0 (the rest is
--         left to reconciliation).
-- Prepended: lua/lib/replid.lua (fg_replid) and lua/lib/time.lua
-- (fg_now_ms).

local replid = fg_replid()
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {replid, 0, 0, -1, 0, 0, 0}
end
local now = fg_now_ms()
local m = tonumber(ARGV[2])
local added, taken = 0, 0
for i = 3, 2 + 3 * m, 3 do
  local xid, from, n = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
  if redis.call('HSETNX', KEYS[4], xid, cjson.encode({from = from, n = n})) == 1 then
    redis.call('INCRBY', KEYS[2], n)
    added = added + 1
  end
end
for i = 3 + 3 * m, #ARGV, 3 do
  local xid, to, n = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
  if redis.call('HEXISTS', KEYS[3], xid) == 0 then
    redis.call('HSET', KEYS[3], xid, cjson.encode({to = to, n = n, at = now, done = true}))
    redis.call('DECRBY', KEYS[2], n)
    taken = taken + 1
  end
end
local remaining = tonumber(redis.call('GET', KEYS[2]) or '0')
local sold = redis.call('HLEN', KEYS[5]) - redis.call('SCARD', KEYS[6])
local change = tonumber(ARGV[1])
local applied = 0
-- A raise first: the items it adds may be what covers a shortfall (applied
-- after the test, a bucket short by less than the raise stayed fenced).
if change > 0 then
  redis.call('HINCRBY', KEYS[1], 'stock', change)
  remaining = redis.call('INCRBY', KEYS[2], change)
  applied = change
end
if remaining < 0 then
  return {replid, added, taken, 0, remaining, sold, applied}
end
-- A cut only as far as what the bucket holds.
if change < 0 then
  applied = math.max(change, -remaining)
  if applied ~= 0 then
    redis.call('HINCRBY', KEYS[1], 'stock', applied)
    remaining = redis.call('INCRBY', KEYS[2], applied)
  end
end
return {replid, added, taken, 1, remaining, sold, applied}
