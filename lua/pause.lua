-- Flashgate pause: writes a sale's pause flag (ARGV[1], "1" or "0") into
-- its meta hash (KEYS[1]), only if the sale is there: never creates a half
-- sale. Answers 1 if written, 0 if the sale is absent.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
redis.call('HSET', KEYS[1], 'paused', ARGV[1])
return 1
