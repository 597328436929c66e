-- Flashgate: moves the base (`stock` in its meta) of one bucket of a
-- bucketed sale together with its `remaining`, atomically in the bucket's
-- slot, so the bucket's books (remaining + reserved + sent - received =
-- base) hold before and after: an operator's stock change or the repair of
-- Σ bases = the database's stock (backend/src/buckets/stock.rs).
--
-- KEYS[1] meta  KEYS[2] remaining  KEYS[3] synced  KEYS[4] moving
--                                                      (all of one bucket)
-- ARGV[1] n: > 0 adds n items (base and remaining); < 0 takes at most -n
--         unsold items (min(remaining, -n) off base and remaining). Items
--         reserved or in transit are never taken. 0 changes nothing (a
--         probe: is the bucket present and not fenced?).
-- ARGV[2] how long (ms) the "stock move in flight" marker lives: set here
--         whenever the base moves, so the sold-out confirmation
--         (lua/bucket_state.lua) never calls the bucket dry while a move
--         (which may give items back) is in flight; the backend deletes it
--         when the move ends, the TTL ends it if the backend died.
-- The replication id is fg_replid (lua/lib/replid.lua, prepended).
-- Reply: {"ok", change} the signed change made (0 when nothing could be
--        taken); {"absent", 0} the bucket is not in Redis; {"fenced", 0}
--        the bucket's Redis failed over since it was synced (its count may
--        lack the last writes): nothing changed by this call.

if redis.call('EXISTS', KEYS[1]) == 0 then
  return {'absent', 0}
end
if redis.call('GET', KEYS[3]) ~= fg_replid() then
  return {'fenced', 0}
end
local n = tonumber(ARGV[1])
if n < 0 then
  local left = tonumber(redis.call('GET', KEYS[2]) or '0')
  n = -math.max(0, math.min(left, -n))
end
if n ~= 0 then
  redis.call('SET', KEYS[4], '1', 'PX', tonumber(ARGV[2]))
  redis.call('HINCRBY', KEYS[1], 'stock', n)
  redis.call('INCRBY', KEYS[2], n)
end
return {'ok', n}
