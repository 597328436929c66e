-- Flashgate deduct-and-reserve as a function, run by lua/deduct_batch.lua
-- for each attempt of a call: that script is lua/lib/decide.lua (after the
-- lib files it needs), this file and its own body (see
-- common/src/scripts.rs).
--
-- fg_deduct(K, A) decides one attempt. K: meta, remaining, buyers, the
-- attempt's idempotency key, stream, resv, the attempt's misses hash,
-- synced, then the four draw keys or none; A: the attempt's nine
-- arguments. Their meaning, the replies and the rules are documented in
-- lua/deduct_batch.lua; it returns one attempt's reply. It reads
-- `master_replid` through fg_replid(), at most once per script call however
-- many attempts it decides; the same for the values no attempt changes
-- (fg_call below).

-- What no attempt can change, read at most once per script call however
-- many attempts it decides: the sale's meta (its numbers parsed once), its
-- fence (`synced`) and the time (the attempts of one call are decided at
-- one instant: every win's reservation `ts` is that call's time). Also
-- kept per call: the sale's keys with the items left (`fg_left`, following
-- the call's own wins), the draw's keys and state (the state read again
-- after an attempt opened the draw) and the one attempt table `fg_deduct`
-- fills in.
local fg_call = {}
local function fg_call_meta(key)
  if fg_call.meta == nil then
    local m = redis.call('HMGET', key, 'starts_at_ms', 'ends_at_ms', 'per_user_limit', 'paused', 'draw_window_ms', 'epoch')
    fg_call.meta = {found = m[1] ~= false, starts = tonumber(m[1]), starts_s = m[1], ends = tonumber(m[2]),
                    limit = tonumber(m[3]), paused = m[4] == '1', window = m[5], epoch = m[6] or '0'}
  end
  return fg_call.meta
end
local function fg_call_synced(key)
  if fg_call.synced == nil then
    fg_call.synced = redis.call('GET', key)
  end
  return fg_call.synced
end
local function fg_call_now()
  if fg_call.now == nil then
    fg_call.now = fg_now_ms()
    fg_call.now_s = tostring(fg_call.now)
  end
  return fg_call.now
end
local function fg_call_draw_state(key)
  if fg_call.draw_state == nil then
    fg_call.draw_state = redis.call('HMGET', key, 'closes_at_ms', 'done')
  end
  return fg_call.draw_state
end

-- An outcome remembered under the attempt's key, as the attempt's reply.
local function fg_deduct_final(a, outcome, detail)
  fg_final(a, outcome, detail)
  return {outcome, detail}
end

local function fg_deduct(K, A)
  local idem = A[2]
  local nonce = A[7] or ''
  if idem ~= '' then
    local first = redis.call('GET', K[4]) or redis.call('HGET', K[7], idem)
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
    local won = redis.call('GET', K[4])
    if won then
      local sep = string.find(won, '|', 1, true)
      return {'won', string.sub(won, 1, sep - 1), string.sub(won, sep + 1), fg_replid()}
    end
  end

  local meta = fg_call_meta(K[1])
  if not meta.found then
    return {'not_found', ''}
  end

  -- The call's shared keys (the sale's, and the draw's if it has them)
  -- and its one attempt table, built by its first attempt that gets here.
  if fg_call.k == nil then
    fg_call.k = {remaining = K[2], buyers = K[3], stream = K[5], resv = K[6]}
    fg_call.draw = K[9] and {state = K[9], entries = K[10], index = K[11], outcomes = K[12]}
    fg_call.a = {}
  end
  local k, draw, a = fg_call.k, fg_call.draw, fg_call.a
  local user = A[1]
  a.user, a.idem, a.rid, a.idem_key, a.misses_key = user, idem, A[3], K[4], K[7]
  a.ttl, a.misses_cap, a.sale, a.bucket = A[4], tonumber(A[6]), A[5], A[9] == '1'

  -- The opening draw. A buy it already holds (the same Idempotency-Key, or
  -- the same call re-sent) is that entry, never a second attempt: its
  -- outcome once decided, else "entered" again.
  local draw_state = draw and fg_call_draw_state(draw.state) or {}
  local entry_name = draw and fg_draw_entry_name(user, idem, nonce)
  local now = fg_call_now()
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

  if now >= meta.ends then
    return fg_deduct_final(a, 'ended', '')
  end
  if meta.paused then
    return {'paused', ''}
  end
  if now < meta.starts then
    return {'not_started', meta.starts_s}
  end

  -- The fence, last before the sale's counters: a sale that has ended, is
  -- paused or has not started is answered as such.
  if fg_call_synced(K[8]) ~= fg_replid() then
    return {'fenced', ''}
  end

  if draw then
    -- The window is fixed by the draw's first entry (`closes_at_ms`): an
    -- operator's later change does not move a draw under way.
    local window = tonumber(meta.window or A[8] or '0') or 0
    local closes = tonumber(draw_state[1] or '') or (meta.starts + window)
    if window > 0 and now < closes then
      -- Nothing the draw could give: answered now, as after the window.
      local bought = tonumber(redis.call('HGET', k.buyers, user) or '0')
      if bought >= meta.limit then
        return fg_deduct_final(a, 'limit_reached', '')
      end
      -- One user holds at most per_user_limit entries, counting the items
      -- already bought (a draw an operator opened mid-sale): more (under
      -- other keys) could not win more, only make an earlier decision likelier.
      local count_name = fg_draw_count_name(user)
      if bought + tonumber(redis.call('HGET', draw.index, count_name) or '0') >= meta.limit then
        return fg_deduct_final(a, 'limit_reached', '')
      end
      if fg_left(k) <= 0 then
        fg_final(a, 'sold_out', '')
        return {'sold_out', '', meta.epoch}
      end
      local entry = redis.call('HLEN', draw.entries) + 1
      redis.call('HSET', draw.entries, entry, cjson.encode({user = user, idem = idem, nonce = nonce, rid = a.rid, at = now}))
      if entry_name then
        redis.call('HSET', draw.index, entry_name, entry)
      end
      redis.call('HINCRBY', draw.index, count_name, 1)
      if not draw_state[1] then
        -- Opened: the next attempt of this call reads the state again.
        fg_call.draw_state = nil
        redis.call('HSET', draw.state, 'closes_at_ms', closes, 'opened_at_ms', now)
        -- A draw nobody runs (every gateway gone) is not kept for ever.
        -- lua/draw_run.lua leaves these TTLs alone while it runs and sets
        -- the record's final TTL when the draw is done.
        local keep = tonumber(A[4]) + 3600
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

  local outcome = fg_take(k, a, meta.limit, fg_call.now_s)
  if outcome == 'sold_out' then
    -- A fresh `sold_out` carries the stock epoch it was decided at (see
    -- lua/release.lua): a gateway flags the sale only if no newer epoch is known.
    return {'sold_out', '', meta.epoch}
  elseif outcome ~= 'won' then
    return {outcome, ''}
  end
  local rid = a.rid
  if idem == '' and nonce ~= '' then
    -- A re-sent call comes within the client's retries (well under a second).
    redis.call('SET', K[4], rid .. '|' .. fg_call.now_s, 'EX', 60)
  end
  -- The record's time goes back with the win, so the gateway's forward
  -- carries the same reservation time as the stream entry.
  return {'won', rid, fg_call.now_s, fg_replid()}
end
