-- Flashgate time: Redis TIME in whole milliseconds, the unit of every time
-- a script stores or compares (see common/src/scripts.rs for who includes
-- it). lua/gcra.lua keeps its own fractional read: its limiter works in
-- fractions of a millisecond.
local function fg_now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
