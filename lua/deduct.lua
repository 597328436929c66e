-- Flashgate deduct-and-reserve: one atomic step per buy attempt.
--
-- KEYS[1] meta        hash   name, stock, per_user_limit, starts_at_ms, ends_at_ms, paused
-- KEYS[2] remaining   string items left
-- KEYS[3] buyers      hash   user -> items reserved
-- KEYS[4] idempotency string this user's Idempotency-Key that won ("won|rid");
--                            without a key, this call's own key ("rid|ts")
-- KEYS[5] stream      stream reservation records
-- KEYS[6] resv        hash   reservation id -> user
-- KEYS[7] misses      hash   this user's Idempotency-Keys that did not win -> outcome
-- KEYS[8] synced      string replication id of the Redis that agrees with the database
-- KEYS[9] draw state   hash  the opening draw (see lua/draw_run.lua); KEYS[9..12]
--                            may be left out: the sale then has no draw
-- KEYS[10] draw entries hash entry number -> entrant (JSON), in arrival order
-- KEYS[11] draw index  hash  entrant name (user and key or nonce) -> entry number;
--                            c:<len>:<user> -> that user's entries
-- KEYS[12] draw outcomes hash entry number -> outcome (JSON)
-- ARGV[1] user id
-- ARGV[2] Idempotency-Key ("" when the buyer sent none)
-- ARGV[3] reservation id to use if this attempt wins
-- ARGV[4] idempotency TTL, seconds
-- ARGV[5] sale id (written into the reservation record)
-- ARGV[6] most keys that did not win remembered per user and sale
-- ARGV[7] without an Idempotency-Key: a nonce of this call, so that the same
--         call sent again (the cluster client re-sends a call whose
--         connection dropped) answers the win it already made instead of
--         taking a second item. Empty: no such guard, and a draw entry of
--         such a call has no name in the draw index (never joined again)
-- ARGV[8] `[fairness] window_ms` of the caller: the draw window of a sale
--         whose meta has no `draw_window_ms` of its own (0 or absent: none)
-- ARGV[9] "1" when the keys are one bucket of a bucketed sale (its home
--         bucket for this user, see common/src/buckets.rs), ARGV[5] still
--         the sale's id: a `sold_out` is then not remembered under the
--         Idempotency-Key, since the gateway moves items into the bucket
--         (lua/xfer_*.lua) and runs this again with the same key
--
-- All keys share the sale's hash tag, so this runs on Redis Cluster too.
-- The shared rules (fg_*) come from lua/lib/decide.lua, prepended.
-- Reply: {outcome, detail}
--   "won"           reservation id, and two more elements: the reservation's
--                   time (Redis TIME, ms), the same `ts` as in the stream,
--                   and this Redis's replication id (`master_replid`: a
--                   replica WAIT confirms the win only on this same Redis)
--   "sold_out"      ""
--   "limit_reached" ""
--   "ended"         ""
--   "not_started"   starts_at_ms
--   "paused"        ""
--   "not_found"     ""
--   "entered"       entry number, and the ms left until the draw closes:
--                   the buy arrived within the sale's draw window and waits
--                   for lua/draw_run.lua to decide it
--                   (also for this same call re-sent: see below)
--   "joined"        the same for a replay of a buy the draw already holds
--                   (same Idempotency-Key): no new entry
--   "draw_pending"  ""  the draw window has closed but the draw is not
--                   decided yet: run lua/draw_run.lua, then buy again (no
--                   buy after the window may take an item before the draw)
--   "fenced"        ""  this Redis became a master since the sale last
--                   agreed with the database (a promoted replica, a restart):
--                   it may lack the last wins, so it sells nothing until the
--                   backend has re-synced the sale (backend/src/fence.rs)
-- A replay of a remembered Idempotency-Key answers the remembered outcome
-- with "replay:" in front, e.g. "replay:won" (without the time; a won one
-- with the replication id as its third element).
-- The same call re-sent (no Idempotency-Key, the same nonce ARGV[7]) is
-- never a replay: it answers what its first send got ("won" with its time,
-- "entered" for the draw entry it made, the draw's outcome once decided).
-- In the draw, a user's entries are capped at the per-user limit (counted
-- in the draw index under fg_draw_count_name): a further key is answered
-- "limit_reached" at once, remembered like any final outcome.
--
-- Memory: a winning key is kept for the TTL (wins are bounded by the
-- stock). Keys that did not win go into one hash per user and sale, at
-- most ARGV[6] of them, expiring ARGV[4] after the last one written; past
-- that cap such a key is not remembered and a retry is answered from the
-- sale's state at that moment. So one account sending random keys cannot
-- grow Redis beyond that cap.

local idem = ARGV[2]
local nonce = ARGV[7] or ''
if idem ~= '' then
  local first = redis.call('GET', KEYS[4]) or redis.call('HGET', KEYS[7], idem)
  if first then
    local sep = string.find(first, '|', 1, true)
    local outcome = string.sub(first, 1, sep - 1)
    if outcome == 'won' then
      return {'replay:won', string.sub(first, sep + 1), fg_replid()}
    end
    return {'replay:' .. outcome, string.sub(first, sep + 1)}
  end
elseif nonce ~= '' then
  -- This very call ran before and won: the same answer, nothing taken.
  local won = redis.call('GET', KEYS[4])
  if won then
    local sep = string.find(won, '|', 1, true)
    return {'won', string.sub(won, 1, sep - 1), string.sub(won, sep + 1), fg_replid()}
  end
end

local meta = redis.call('HMGET', KEYS[1], 'starts_at_ms', 'ends_at_ms', 'per_user_limit', 'paused', 'draw_window_ms')
if not meta[1] then
  return {'not_found', ''}
end

local user = ARGV[1]
local a = {user = user, idem = idem, rid = ARGV[3], idem_key = KEYS[4], misses_key = KEYS[7],
           ttl = ARGV[4], misses_cap = tonumber(ARGV[6]), sale = ARGV[5], bucket = ARGV[9] == '1'}
local k = {remaining = KEYS[2], buyers = KEYS[3], stream = KEYS[5], resv = KEYS[6]}

local function final(outcome, detail)
  fg_final(a, outcome, detail)
  return {outcome, detail}
end

-- The opening draw. A buy it already holds (the same Idempotency-Key, or
-- the same call re-sent) is that entry, never a second attempt: its
-- outcome once decided, else "entered" again.
local draw = KEYS[9] and {state = KEYS[9], entries = KEYS[10], index = KEYS[11], outcomes = KEYS[12]}
local draw_state = draw and redis.call('HMGET', draw.state, 'closes_at_ms', 'done') or {}
local entry_name = draw and fg_draw_entry_name(user, idem, nonce)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if draw_state[1] and entry_name then
  local entry = redis.call('HGET', draw.index, entry_name)
  if entry then
    local decided = redis.call('HGET', draw.outcomes, entry)
    local left = tostring(math.max(0, tonumber(draw_state[1]) - now))
    if idem == '' then
      -- Named by the call's nonce: this very call re-sent (same arguments,
      -- its reservation id included), not a client's replay. It gets the
      -- answer the first send would have got: "entered", or the outcome
      -- as decided (a win with its reservation time, as a fresh win).
      if not decided then
        return {'entered', entry, left}
      end
      local d = cjson.decode(decided)
      if d.o == 'won' then
        return {'won', d.d, tostring(d.ts), d.node}
      end
      return {d.o, d.d}
    end
    if decided then
      local d = cjson.decode(decided)
      if d.o == 'won' then
        return {'replay:won', d.d, d.node}
      end
      return {'replay:' .. d.o, d.d}
    end
    return {'joined', entry, left}
  end
end

if now >= tonumber(meta[2]) then
  return final('ended', '')
end
if meta[4] == '1' then
  return {'paused', ''}
end
if now < tonumber(meta[1]) then
  return {'not_started', meta[1]}
end

-- The fence, last before the sale's counters: a sale that has ended, is
-- paused or has not started is answered as such.
if redis.call('GET', KEYS[8]) ~= fg_replid() then
  return {'fenced', ''}
end

if draw then
  -- The window is fixed by the draw's first entry (`closes_at_ms`): an
  -- operator's later change does not move a draw under way.
  local window = tonumber(meta[5] or ARGV[8] or '0') or 0
  local closes = tonumber(draw_state[1] or '') or (tonumber(meta[1]) + window)
  if window > 0 and now < closes then
    -- Nothing the draw could give: answered now, as after the window.
    local bought = tonumber(redis.call('HGET', k.buyers, user) or '0')
    if bought >= tonumber(meta[3]) then
      return final('limit_reached', '')
    end
    -- One user holds at most per_user_limit entries, counting the items
    -- already bought (a draw an operator opened mid-sale): more (under
    -- other keys) could not win more, only make an earlier decision likelier.
    local count_name = fg_draw_count_name(user)
    if bought + tonumber(redis.call('HGET', draw.index, count_name) or '0') >= tonumber(meta[3]) then
      return final('limit_reached', '')
    end
    if tonumber(redis.call('GET', k.remaining) or '0') <= 0 then
      return final('sold_out', '')
    end
    local entry = redis.call('HLEN', draw.entries) + 1
    redis.call('HSET', draw.entries, entry, cjson.encode({user = user, idem = idem, nonce = nonce, rid = a.rid, at = now}))
    if entry_name then
      redis.call('HSET', draw.index, entry_name, entry)
    end
    redis.call('HINCRBY', draw.index, count_name, 1)
    if not draw_state[1] then
      redis.call('HSET', draw.state, 'closes_at_ms', closes, 'opened_at_ms', now)
      -- A draw nobody runs (every gateway gone) is not kept for ever.
      -- lua/draw_run.lua leaves these TTLs alone while it runs and sets
      -- the record's final TTL when the draw is done.
      local keep = tonumber(ARGV[4]) + 3600
      for _, key in ipairs({draw.state, draw.entries, draw.index}) do
        redis.call('EXPIRE', key, keep)
      end
    end
    return {'entered', tostring(entry), tostring(closes - now)}
  end
  if draw_state[1] and draw_state[2] ~= '1' then
    return {'draw_pending', ''}
  end
end

local outcome = fg_take(k, a, tonumber(meta[3]), now)
if outcome ~= 'won' then
  return {outcome, ''}
end
local rid = a.rid
if idem == '' and nonce ~= '' then
  -- A re-sent call comes within the client's retries (well under a second).
  redis.call('SET', KEYS[4], rid .. '|' .. tostring(now), 'EX', 60)
end
-- The record's time goes back with the win, so the gateway's forward
-- carries the same reservation time as the stream entry.
return {'won', rid, tostring(now), fg_replid()}
