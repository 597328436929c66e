-- Flashgate adopt: makes Redis count an order the database holds but Redis
-- does not know (its reservation was lost with the last writes before a
-- Redis crash), so the item cannot be sold a second time. Idempotent.
--
-- KEYS[1] meta  KEYS[2] remaining  KEYS[3] buyers  KEYS[4] resv  KEYS[5] released
-- ARGV[1] reservation id  ARGV[2] user id
-- The count is fg_count_reservation (lua/lib/books.lua, prepended).
-- Reply: 1 adopted now; 0 already known (or returned); -1 the sale is absent.

if redis.call('EXISTS', KEYS[1]) == 0 then
  return -1
end
if redis.call('SISMEMBER', KEYS[5], ARGV[1]) == 1 then
  return 0
end
if redis.call('HEXISTS', KEYS[4], ARGV[1]) == 1 then
  return 0
end
fg_count_reservation({remaining = KEYS[2], buyers = KEYS[3], resv = KEYS[4]}, ARGV[1], ARGV[2])
return 1
