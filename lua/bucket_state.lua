-- Flashgate: one bucket of a bucketed sale, read atomically in its slot,
-- for the sold-out confirmation (common/src/transfer.rs, `confirm_dry`):
-- a sale is answered sold out only when every bucket holds nothing and
-- has no transfer out of it open and no stock move in flight, seen twice
-- with nothing moved between (its base included: a stock change adds
-- items to a bucket without a transfer or a return).
--
-- KEYS[1] meta  KEYS[2] remaining  KEYS[3] xfer-open  KEYS[4] xfer-in
-- KEYS[5] released  KEYS[6] moving  KEYS[7] synced     (all of one bucket)
-- Reply: {present (0/1), remaining, open transfers out, transfers in,
--         returned reservations, base (meta `stock`), stock move in
--         flight (0/1), fenced (0/1)}
-- A fenced bucket (its Redis failed over since it was synced: `synced`
-- differs from this Redis's replication id) may lack the last writes, a
-- transfer or a return among them: its counts prove nothing until its
-- re-sync (backend/src/fence/bucketed.rs), so it is never called dry.
-- The replication id is fg_replid (lua/lib/replid.lua, prepended).

if redis.call('EXISTS', KEYS[1]) == 0 then
  return {0, 0, 0, 0, 0, 0, 0, 0}
end
local replid = fg_replid()
return {
  1,
  tonumber(redis.call('GET', KEYS[2]) or '0'),
  redis.call('ZCARD', KEYS[3]),
  redis.call('HLEN', KEYS[4]),
  redis.call('SCARD', KEYS[5]),
  tonumber(redis.call('HGET', KEYS[1], 'stock') or '0'),
  redis.call('EXISTS', KEYS[6]),
  redis.call('GET', KEYS[7]) == replid and 0 or 1,
}
