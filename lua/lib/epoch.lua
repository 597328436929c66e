-- Flashgate stock epoch, shared by lua/release.lua, lua/update_sale.lua,
-- lua/resync.lua and lua/preheat.lua (each is lua/lib/time.lua, this file,
-- then its own body, see common/src/scripts.rs).
--
-- A one-bucket sale's meta field `epoch` goes up whenever items may come
-- back to its stock (a return, an operator's change, a re-sync, a restore).
-- A fresh `sold_out` of the deduct carries the epoch it was decided at, and
-- a gateway ignores one older than an epoch it already knows: it was
-- decided before the items came back (gateway/src/sales/cache.rs). The new
-- epoch is Redis's time in ms, or one more than the last when that is
-- later: it never goes back, not across a restore (the meta is written
-- anew) nor across a failover (a promoted replica may lack the old
-- master's last bumps), as long as clocks do not go back by more.
local function fg_bump_epoch(meta)
  local now = fg_now_ms()
  local held = tonumber(redis.call('HGET', meta, 'epoch') or '0') or 0
  redis.call('HSET', meta, 'epoch', string.format('%d', math.max(held + 1, now)))
end
