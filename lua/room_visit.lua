-- Flashgate waiting room: one visitor not (or no longer) inside asks to
-- come in (after lua/lib/time.lua and lua/lib/room.lua). Atomic on the
-- room's slot, so every gateway shares one queue and one bound.
--
-- KEYS[1] queue, KEYS[2] inside, KEYS[3] state (common/src/keys.rs RoomKeys)
-- ARGV[1] visitor id
-- ARGV[2] the place the visitor's cookie holds (its score), '' for none
-- ARGV[3] a random score in [0, 2^40): the place of a random arrival
-- ARGV[4] active_users       ARGV[5] new_users_per_minute (0: none)
-- ARGV[6] session, ms        ARGV[7] a called visitor's grace, ms
-- ARGV[8] the configured mode ARGV[9] starts_at, Unix ms (0: none)
-- ARGV[10] the random window after the start, ms (-1: fifo)
-- Reply {state, n, score, mode}:
--   {'in', until_ms, 0, mode}       let in, inside until until_ms
--   {'queued', place, score, mode}  waiting at place (1 = next); the score is the cookie's
--   {'full', 0, 0, mode}            `reject`: no space, no place given
--   {'pass', 0, 0, mode}            `passthrough`: the room is open

local vid = ARGV[1]
local held = ARGV[2]
local active = tonumber(ARGV[4])
local per_minute = tonumber(ARGV[5])
local session_ms = tonumber(ARGV[6])
local starts_at = tonumber(ARGV[9])
local window = tonumber(ARGV[10])
local now = fg_now_ms()

local mode = fg_room_mode(ARGV[8])
if mode == 'passthrough' then
  return {'pass', 0, 0, mode}
end
local started = starts_at == 0 or now >= starts_at
fg_room_admit(now, active, per_minute, tonumber(ARGV[7]), started)

local function let_in()
  local until_ms = now + session_ms
  redis.call('ZADD', KEYS[2], until_ms, vid)
  return {'in', until_ms, 0, mode}
end

local function queued(score)
  redis.call('ZADD', KEYS[1], 'NX', score, vid)
  return {'queued', redis.call('ZRANK', KEYS[1], vid) + 1, score, mode}
end

-- Called in (or inside still): a session from now.
if redis.call('ZSCORE', KEYS[2], vid) then
  return let_in()
end
if held ~= '' then
  -- The place the cookie holds, put back if Redis lost it.
  local score = redis.call('ZSCORE', KEYS[1], vid) or held
  return queued(tonumber(score))
end

redis.call('HSETNX', KEYS[3], 'opened_ms', now)
if started and redis.call('ZCARD', KEYS[1]) == 0 then
  local free, tokens = fg_room_space(now, active, per_minute)
  if free >= 1 then
    fg_room_count(now, 1, per_minute, tokens)
    return let_in()
  end
end
if mode == 'reject' then
  return {'full', 0, 0, mode}
end
if window >= 0 then
  local opened = starts_at
  if opened == 0 then
    opened = tonumber(redis.call('HGET', KEYS[3], 'opened_ms'))
  end
  if now < opened + window then
    return queued(tonumber(ARGV[3]))
  end
end
return queued(1099511627776 + redis.call('HINCRBY', KEYS[3], 'seq', 1))
