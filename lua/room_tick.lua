-- Flashgate waiting room: one gateway's periodic call per room (after
-- lua/lib/time.lua and lua/lib/room.lua): the sessions it renewed, the
-- admission step, and the room's state for its pages and metrics.
--
-- KEYS[1] queue, KEYS[2] inside, KEYS[3] state, KEYS[4] called
-- ARGV[1] active_users  ARGV[2] new_users_per_minute  ARGV[3] grace, ms
-- ARGV[4] the configured mode  ARGV[5] starts_at, Unix ms (0: none)
-- ARGV[6..] pairs: visitor id, inside until (ms): sessions renewed since
--           the last tick. Only a visitor still inside is renewed (never
--           shortened, never added back): a renewal that comes after its
--           session ended would count a visitor the room already replaced.
-- Reply {mode, inside, waiting, rate per second (string), admitted, now, late}
--   late: renewals that found their visitor gone

local now = fg_now_ms()
local late = 0
for i = 6, #ARGV, 2 do
  local ends = redis.call('ZSCORE', KEYS[2], ARGV[i])
  if ends and tonumber(ends) > now then
    redis.call('ZADD', KEYS[2], 'XX', 'GT', tonumber(ARGV[i + 1]), ARGV[i])
  else
    late = late + 1
  end
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
  now,
  late,
}
