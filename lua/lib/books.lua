-- Flashgate books of a sale (or of one bucket of a bucketed sale): what a
-- reservation counts in Redis, written once for every script that counts
-- one or gives its item back (see common/src/scripts.rs for who includes
-- it). `k` holds the keys, all of one hash tag:
--   remaining  items left to sell
--   buyers     user -> items reserved (the per-user limit)
--   resv       reservation id -> user: the reservations Redis counts
--   released   reservation ids whose item went back
-- The callers decide whether a reservation is counted or returned already;
-- these only write (fg_take_slot also checks the per-user limit it counts
-- against).

-- Counts reservation `rid` of `user` whose slot under the per-user limit
-- is counted already (fg_take_slot): its item out of `remaining` and
-- `rid` in `resv`. Returns the items left.
local function fg_count_item(k, rid, user)
  local left = redis.call('DECR', k.remaining)
  redis.call('HSET', k.resv, rid, user)
  return left
end

-- Counts reservation `rid` of `user`: one more for `user` under the
-- per-user limit, its item out of `remaining`, and `rid` in `resv`.
-- Returns the items left.
local function fg_count_reservation(k, rid, user)
  redis.call('HINCRBY', k.buyers, user, '1')
  return fg_count_item(k, rid, user)
end

-- Takes a slot of `user` under the per-user `limit` (one more in
-- `buyers`), or answers false and leaves `buyers` as it was when the user
-- holds `limit` already. One call for a buy that passes (the common case
-- while stock lasts) where a read then an increment would be two; a
-- refusal writes twice, the second undoing the first (so on a node that
-- refuses writes it gets the node's error, as a win would).
local function fg_take_slot(k, user, limit)
  if redis.call('HINCRBY', k.buyers, user, '1') <= limit then
    return true
  end
  -- Back to the `limit` or more the user held: the field stays (a sale's
  -- limit is at least 1, see common/src/sale.rs).
  redis.call('HINCRBY', k.buyers, user, '-1')
  return false
end

-- Gives back the item of counted reservation `rid`, held by `owner` (its
-- user in `resv`): `rid` recorded as returned, its item back in
-- `remaining`, and `owner`'s slot under the per-user limit freed.
local function fg_give_back(k, rid, owner)
  redis.call('SADD', k.released, rid)
  redis.call('INCR', k.remaining)
  if redis.call('HINCRBY', k.buyers, owner, -1) <= 0 then
    redis.call('HDEL', k.buyers, owner)
  end
end

-- Records as returned reservation `rid` of `user`, which Redis never
-- counted: nothing to give back, no counter changes, but it is in `resv`
-- and `released` so that a later adoption cannot count it either.
local function fg_record_uncounted_return(k, rid, user)
  redis.call('HSET', k.resv, rid, user)
  redis.call('SADD', k.released, rid)
end
