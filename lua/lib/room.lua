-- Flashgate waiting room: the admission step of lua/room_visit.lua and
-- lua/room_tick.lua (after lua/lib/time.lua), on the room's keys in the
-- callers' order: KEYS[1] queue, KEYS[2] inside, KEYS[3] state, KEYS[4]
-- called.
--
-- Visitors leave the room when their time inside ends (`inside` scores,
-- ms); the head of the queue is called in while the room has space and the
-- `new_users_per_minute` bucket has tokens. A called visitor holds their
-- slot for `grace_ms` until they come back and are let in for a session;
-- their place is used up (`called`, kept a day: as long as a waiting
-- cookie lives), so a saved cookie never puts them back in line.

-- Time constant of the measured admission rate (an exponentially weighted
-- rate per second, in `state` fields `rate` and `rate_ms`).
local FG_ROOM_RATE_TAU_MS = 60000
-- Most visitors called in by one call (one ZADD's arguments).
local FG_ROOM_MAX_CALL = 1000
-- How long a used place is remembered: a waiting cookie's lifetime.
local FG_ROOM_CALLED_MS = 86400000

-- The admission rate per second at `now`, `added` admissions counted in.
-- In the room's first minutes the weights of the time before it opened
-- are taken out (the average's start-up bias), so the first estimates are
-- the rate seen so far rather than a fraction of it.
local function fg_room_rate(now, added)
  local st = redis.call('HMGET', KEYS[3], 'rate', 'rate_ms', 'opened_ms')
  local rate = tonumber(st[1] or '0')
  local at = tonumber(st[2] or tostring(now))
  local dt = now - at
  if dt < 0 then dt = 0 end
  rate = rate * math.exp(-dt / FG_ROOM_RATE_TAU_MS) + added * 1000 / FG_ROOM_RATE_TAU_MS
  if added > 0 then
    redis.call('HSET', KEYS[3], 'rate', tostring(rate), 'rate_ms', now)
  end
  local age = now - tonumber(st[3] or tostring(now))
  if age >= 1000 then
    rate = rate / (1 - math.exp(-age / FG_ROOM_RATE_TAU_MS))
  end
  return rate
end

-- Tokens of the `per_minute` bucket at `now` (ten seconds' worth at most).
local function fg_room_tokens(now, per_minute)
  local cap = math.max(1, math.floor(per_minute / 6))
  local st = redis.call('HMGET', KEYS[3], 'tokens', 'tokens_ms')
  local tokens = tonumber(st[1] or tostring(cap))
  local at = tonumber(st[2] or tostring(now))
  local dt = now - at
  if dt < 0 then dt = 0 end
  return math.min(cap, tokens + dt * per_minute / 60000)
end

-- `n` visitors let in at `now`: the bucket and the measured rate.
local function fg_room_count(now, n, per_minute, tokens)
  if per_minute > 0 then
    redis.call('HSET', KEYS[3], 'tokens', tostring(tokens - n), 'tokens_ms', now)
  end
  redis.call('HINCRBY', KEYS[3], 'admitted', n)
  fg_room_rate(now, n)
end

-- How many more visitors may be let in now: space inside, tokens (and the
-- tokens read, for fg_room_count).
local function fg_room_space(now, active, per_minute)
  local free = active - redis.call('ZCARD', KEYS[2])
  local tokens = nil
  if per_minute > 0 and free > 0 then
    tokens = fg_room_tokens(now, per_minute)
    free = math.min(free, math.floor(tokens))
  end
  return free, tokens
end

-- Expires who left; while `started`, calls the head of the queue in.
local function fg_room_admit(now, active, per_minute, grace_ms, started)
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now - FG_ROOM_CALLED_MS)
  if not started then return end
  local waiting = redis.call('ZCARD', KEYS[1])
  if waiting == 0 then return end
  local free, tokens = fg_room_space(now, active, per_minute)
  local n = math.min(free, waiting, FG_ROOM_MAX_CALL)
  if n <= 0 then return end
  local called = redis.call('ZPOPMIN', KEYS[1], n)
  local inside, used = {}, {}
  for i = 1, #called, 2 do
    inside[#inside + 1] = now + grace_ms
    inside[#inside + 1] = called[i]
    used[#used + 1] = now
    used[#used + 1] = called[i]
  end
  redis.call('ZADD', KEYS[2], unpack(inside))
  redis.call('ZADD', KEYS[4], unpack(used))
  -- The last place called: a new ticket's place counts from it.
  local last = tonumber(called[#called])
  if last > tonumber(redis.call('HGET', KEYS[3], 'called_upto') or '0') then
    redis.call('HSET', KEYS[3], 'called_upto', called[#called])
  end
  fg_room_count(now, #called / 2, per_minute, tokens)
end

-- The room's mode: the admin switch, else the configured one.
local function fg_room_mode(configured)
  return redis.call('HGET', KEYS[3], 'mode') or configured
end
