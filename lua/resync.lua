-- Flashgate re-sync: makes a fenced sale's Redis count a page of the orders
-- the database holds, so that after a failover or a restart no item the
-- database has sold is sold again and no buyer passes the per-user limit.
-- Idempotent: what Redis already counts is left as it is.
--
-- KEYS[1] meta  KEYS[2] remaining  KEYS[3] buyers  KEYS[4] resv  KEYS[5] released
-- KEYS[6..] the Idempotency-Key keys of the orders that have one
-- ARGV[1..] five per order: reservation id, user id, `live` or `cancelled`,
--           the index in KEYS of its Idempotency-Key key (0: none), and the
--           seconds that key has left to live (what is left of the
--           idempotency TTL since the win)
-- Reply: {this Redis's replication id, orders counted now, items returned now}
--        with -1 as the count when the sale is not here.
--
-- A live order Redis does not know is counted like a win (`resv`, `buyers`,
-- `remaining`). Every order's Idempotency-Key answers its win again. A cancelled
-- order whose item Redis still counts gives it back, as lua/release.lua
-- does; one Redis never counted is recorded as returned, changing nothing.
-- Prepended: lua/lib/replid.lua (fg_replid), lua/lib/books.lua (the count
-- and the return, as lua/adopt.lua and lua/release.lua write them),
-- lua/lib/time.lua and lua/lib/epoch.lua (fg_bump_epoch).

local replid = fg_replid()
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {replid, -1, 0}
end
local k = {remaining = KEYS[2], buyers = KEYS[3], resv = KEYS[4], released = KEYS[5]}
local adopted, returned = 0, 0
for i = 1, #ARGV, 5 do
  local rid, user, status, key = ARGV[i], ARGV[i + 1], ARGV[i + 2], tonumber(ARGV[i + 3])
  if redis.call('SISMEMBER', KEYS[5], rid) == 0 then
    if status == 'live' then
      if redis.call('HEXISTS', k.resv, rid) == 0 then
        fg_count_reservation(k, rid, user)
        adopted = adopted + 1
      end
    else
      local owner = redis.call('HGET', k.resv, rid)
      if owner then
        fg_give_back(k, rid, owner)
        returned = returned + 1
      else
        fg_record_uncounted_return(k, rid, user)
      end
    end
  end
  -- A retry with the key replays the win (or tells the order was
  -- cancelled), never wins a second time.
  if key > 0 then
    redis.call('SET', KEYS[key], 'won|' .. rid, 'EX', ARGV[i + 4], 'NX')
  end
end
-- Counted again: a newer stock epoch (lua/lib/epoch.lua).
fg_bump_epoch(KEYS[1])
return {replid, adopted, returned}
