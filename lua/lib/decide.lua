-- Flashgate buy decision, shared by lua/deduct_batch.lua and lua/draw_run.lua:
-- each of those scripts is lua/lib/replid.lua, lua/lib/time.lua,
-- lua/lib/books.lua, this file, then its own body (see
-- common/src/scripts.rs), so a buyer of the opening draw is decided by
-- exactly the rules of a buyer who comes after it.
--
-- An attempt `a` is a table:
--   user        user id
--   idem        Idempotency-Key ("" when the buyer sent none)
--   rid         reservation id to use if the attempt wins
--   idem_key    the key that remembers a win under the Idempotency-Key
--   misses_key  the user's capped hash of keys that did not win
--   ttl         idempotency TTL, seconds
--   misses_cap  most keys that did not win remembered per user and sale
--   sale        sale id (written into the reservation record)
--   bucket      true when the keys are a bucket's of a bucketed sale
-- The sale's keys `k`: remaining, buyers, stream, resv.

-- Remembers a final outcome under the Idempotency-Key. Outcomes that may
-- change on a later attempt (not started, paused) are never passed here.
local function fg_final(a, outcome, detail)
  -- A bucket of a bucketed sale answering sold out is not final: the
  -- gateway moves items into it and asks again with the same key.
  if a.idem ~= '' and not (a.bucket and outcome == 'sold_out') then
    if outcome == 'won' then
      redis.call('SET', a.idem_key, outcome .. '|' .. detail, 'EX', a.ttl)
    elseif redis.call('HLEN', a.misses_key) < a.misses_cap then
      redis.call('HSET', a.misses_key, a.idem, outcome .. '|' .. detail)
      redis.call('EXPIRE', a.misses_key, a.ttl)
    end
  end
end

-- The items left (`remaining`), read once per script call: `k` is built
-- once per call and `k.left` follows the call's own wins, set from their
-- `DECR`. No other write to `remaining` happens while a script runs, and
-- the count is dropped before a win's writes and set again once its
-- reservation is counted: a win that fails in between leaves it unknown,
-- read again by the next attempt, never one item too many.
local function fg_left(k)
  if k.left == nil then
    k.left = tonumber(redis.call('GET', k.remaining) or '0')
  end
  return k.left
end

-- The per-user limit, the stock, and the win, for a sale that is open and
-- not fenced at `now` (ms, Redis TIME; `now_s` the same as a string):
-- answers `won`, `limit_reached` or `sold_out`, remembered under the
-- attempt's key. A user at the limit hears `limit_reached`, sold out or
-- not.
local function fg_take(k, a, limit, now_s)
  local left = fg_left(k)
  if left <= 0 then
    if tonumber(redis.call('HGET', k.buyers, a.user) or '0') >= limit then
      fg_final(a, 'limit_reached', '')
      return 'limit_reached'
    end
    fg_final(a, 'sold_out', '')
    return 'sold_out'
  end
  if not fg_take_slot(k, a.user, limit) then
    fg_final(a, 'limit_reached', '')
    return 'limit_reached'
  end
  -- Unknown until the count's DECR answers (see fg_left).
  k.left = nil
  k.left = fg_count_item(k, a.rid, a.user)
  -- The reservation record: one field, its parts joined by spaces, the
  -- Idempotency-Key last (see common/src/reservation.rs).
  redis.call('XADD', k.stream, '*', 'r',
             a.rid .. ' ' .. a.sale .. ' ' .. a.user .. ' ' .. now_s .. ' ' .. a.idem)
  fg_final(a, 'won', a.rid)
  return 'won'
end

-- The key of a buy in the draw's index: by user and Idempotency-Key, or by
-- user and the call's nonce when the buyer sent no key. The user id goes
-- in with its length, so two users' ids and keys can never make one name.
-- Neither key nor nonce (a caller that sends no nonce; the gateway always
-- does): no name, so the entry is never found again. A shared name
-- `n:<len>:<user>:` would make every such call of a user one entry.
local function fg_draw_entry_name(user, idem, nonce)
  if idem ~= '' then
    return 'k:' .. #user .. ':' .. user .. ':' .. idem
  end
  if nonce ~= '' then
    return 'n:' .. #user .. ':' .. user .. ':' .. nonce
  end
  return nil
end

-- The field of the draw's index counting a user's entries ("c:", never a
-- prefix of an entrant name): lua/deduct_batch.lua admits at most the per-user
-- limit of them.
local function fg_draw_count_name(user)
  return 'c:' .. #user .. ':' .. user
end

