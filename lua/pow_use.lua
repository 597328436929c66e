-- Flashgate proof-of-work use: records that a solution was used, once.
-- The same buy sent again (same non-empty Idempotency-Key: a network
-- retry of the page) may use it again, a few times: enough for retries,
-- too few to poll the sale with one solution.
--
-- KEYS[1] the solution's key (`fg:{sale:ID}:pow:<challenge id>`)
-- ARGV[1] the buy's marker: "k:" followed by its Idempotency-Key ("k:" alone
--         without one)
-- ARGV[2] how long to remember it, ms (until the challenge expires, and a
--         margin for clocks)
-- ARGV[3] the most re-sends of one buy
-- Reply: 1 first use; 2 a re-send of the same buy; 0 used (by another buy,
--        or re-sent too often)

if redis.call('SET', KEYS[1], ARGV[1] .. '|0', 'NX', 'PX', ARGV[2]) then
  return 1
end
if ARGV[1] == 'k:' then
  return 0
end
local held = redis.call('GET', KEYS[1]) or ''
local sep = string.find(held, '|[^|]*$')
if not sep or string.sub(held, 1, sep - 1) ~= ARGV[1] then
  return 0
end
local resent = tonumber(string.sub(held, sep + 1)) or 0
if resent >= tonumber(ARGV[3]) then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1] .. '|' .. (resent + 1), 'KEEPTTL')
return 2
