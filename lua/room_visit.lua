-- Flashgate waiting room: one visitor not (or no longer) inside asks to
-- come in (after lua/lib/time.lua and lua/lib/room.lua). Atomic on the
-- room's slot, so every gateway shares one queue and one bound.
--
-- KEYS[1] queue, KEYS[2] inside, KEYS[3] state, KEYS[4] called
--   (common/src/keys.rs RoomKeys)
-- ARGV[1] visitor id
-- ARGV[2] the place the visitor's cookie holds (its score), '' for none
-- ARGV[3] a random score in [0, 2^40): the place of a random arrival
-- ARGV[4] active_users       ARGV[5] new_users_per_minute (0: none)
-- ARGV[6] session, ms        ARGV[7] a called visitor's grace, ms
-- ARGV[8] the configured mode ARGV[9] starts_at, Unix ms (0: none)
-- ARGV[10] the random window after the start, ms (-1: fifo)
-- Reply {state, n, score, mode, now}:
--   {'in', until_ms, 0, mode, now}       let in, inside until until_ms
--   {'queued', place, score, mode, now}  waiting at place (1 = next); the score is the cookie's
--   {'full', 0, 0, mode, now}            `reject`: no space, no place given
--   {'pass', 0, 0, mode, now}            `passthrough`: the room is open
--
-- A new arrival's place is drawn but not stored: it is in their cookie,
-- and it enters the queue when they come back with it. A client that
-- keeps no cookie costs a ticket and no memory. While tickets drawn within
-- the grace may still come back, nobody new skips the line.

local TICKETS = 1099511627776 -- 2^40: random places below, tickets above
local vid = ARGV[1]
local held = ARGV[2]
local active = tonumber(ARGV[4])
local per_minute = tonumber(ARGV[5])
local session_ms = tonumber(ARGV[6])
local grace_ms = tonumber(ARGV[7])
local starts_at = tonumber(ARGV[9])
local window = tonumber(ARGV[10])
local now = fg_now_ms()

local mode = fg_room_mode(ARGV[8])
if mode == 'passthrough' then
  return {'pass', 0, 0, mode, now}
end
local started = starts_at == 0 or now >= starts_at
fg_room_admit(now, active, per_minute, grace_ms, started)

local function let_in(until_ms)
  redis.call('ZADD', KEYS[2], until_ms, vid)
  return {'in', until_ms, 0, mode, now}
end

-- A new place: a ticket counts every ticket drawn before it and not yet
-- called (their holders may still come back); a random place, the
-- places below it in the queue.
local function place_of(score)
  if score > TICKETS then
    local upto = tonumber(redis.call('HGET', KEYS[3], 'called_upto') or '0')
    return score - math.max(upto, TICKETS)
  end
  return redis.call('ZCOUNT', KEYS[1], '-inf', '(' .. score) + 1
end

-- Called in (or inside still): a session from now.
if redis.call('ZSCORE', KEYS[2], vid) then
  return let_in(now + session_ms)
end
if held ~= '' then
  local score = redis.call('ZSCORE', KEYS[1], vid)
  if not score and not redis.call('ZSCORE', KEYS[4], vid) then
    -- Back with the place drawn at arrival, or one Redis lost: kept.
    score = held
    redis.call('ZADD', KEYS[1], 'NX', score, vid)
    local ticket = tonumber(held) - TICKETS
    if ticket > tonumber(redis.call('HGET', KEYS[3], 'seq') or '0') then
      redis.call('HSET', KEYS[3], 'seq', ticket)
    end
  end
  if score then
    return {'queued', redis.call('ZRANK', KEYS[1], vid) + 1, tonumber(score), mode, now}
  end
  -- Their place was used (called in, and the grace passed): a new arrival.
end

redis.call('HSETNX', KEYS[3], 'opened_ms', now)
local drawn = tonumber(redis.call('HGET', KEYS[3], 'drawn_ms') or '0')
if started and redis.call('ZCARD', KEYS[1]) == 0 and now - drawn > grace_ms then
  local free, tokens = fg_room_space(now, active, per_minute)
  if free >= 1 then
    fg_room_count(now, 1, per_minute, tokens)
    -- Until the grace only: a client that never comes back (a bot, a
    -- monitor) holds no seat for a whole session; one that does is
    -- renewed on its next request.
    return let_in(now + math.min(grace_ms, session_ms))
  end
end
if mode == 'reject' then
  return {'full', 0, 0, mode, now}
end
redis.call('HSET', KEYS[3], 'drawn_ms', now)
local score = nil
if window >= 0 then
  local opened = starts_at
  if opened == 0 then
    opened = tonumber(redis.call('HGET', KEYS[3], 'opened_ms'))
  end
  if now < opened + window then
    score = tonumber(ARGV[3])
  end
end
if not score then
  score = TICKETS + redis.call('HINCRBY', KEYS[3], 'seq', 1)
end
return {'queued', place_of(score), score, mode, now}
