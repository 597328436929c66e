-- Flashgate waiting room: one gateway's periodic call per room (after
-- lua/lib/time.lua and lua/lib/room.lua): the sessions it renewed, the
-- admission step, and the room's state for its pages and metrics.
--
-- KEYS[1] queue, KEYS[2] inside, KEYS[3] state
-- ARGV[1] active_users  ARGV[2] new_users_per_minute  ARGV[3] grace, ms
-- ARGV[4] the configured mode  ARGV[5] starts_at, Unix ms (0: none)
-- ARGV[6..] pairs: visitor id, inside until (ms): sessions renewed since
--           the last tick (never shortened)
-- Reply {mode, inside, waiting, rate per second (string), admitted}

local now = fg_now_ms()
for i = 6, #ARGV, 2 do
  redis.call('ZADD', KEYS[2], 'GT', tonumber(ARGV[i + 1]), ARGV[i])
end
local mode = fg_room_mode(ARGV[4])
local starts_at = tonumber(ARGV[5])
-- In `passthrough` nobody is called in; sessions still end.
fg_room_admit(now, tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]),
  mode ~= 'passthrough' and (starts_at == 0 or now >= starts_at))
return {
  mode,
  redis.call('ZCARD', KEYS[2]),
  redis.call('ZCARD', KEYS[1]),
  tostring(fg_room_rate(now, 0)),
  tonumber(redis.call('HGET', KEYS[3], 'admitted') or '0'),
}
