-- Flashgate cluster-wide rate limit: GCRA on one key shared by every gateway.
--
-- KEYS[1] the limiter's theoretical arrival time (TAT), ms
-- ARGV[1] emission interval, ms (1000 / per_second)
-- ARGV[2] burst tolerance, ms ((burst - 1) * interval)
-- Reply: {1, 0} allowed; {0, wait_ms} limited.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local interval = tonumber(ARGV[1])
local tolerance = tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then
  tat = now
end
if now < tat - tolerance then
  return {0, math.ceil(tat - tolerance - now)}
end
local new_tat = tat + interval
redis.call('SET', KEYS[1], tostring(new_tat), 'PX', math.ceil(new_tat - now + tolerance) + 1000)
return {1, 0}
