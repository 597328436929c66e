-- Flashgate stock return: gives back the item of one cancelled reservation,
-- at most once whatever the number of calls, and frees the buyer's slot
-- under the per-user limit.
--
-- Only a reservation Redis counted has an item to give back: one in `resv`
-- (the deduct script, a restore and lua/adopt.lua write it together with
-- the decrement). An order whose reservation Redis never counted (written
-- from the gateway's forward while Redis lost the reservation) is adopted
-- and returned in the same step, which changes no counter: it is recorded
-- in `resv` and `released`, so a later adoption cannot count it either.
--
-- KEYS[1] meta  KEYS[2] remaining  KEYS[3] buyers  KEYS[4] resv  KEYS[5] released
-- ARGV[1] reservation id  ARGV[2] user id (used only for a reservation
--         Redis never counted; otherwise the user `resv` holds is freed)
-- All keys share the sale's hash tag.
--
-- An item given back moves the sale's stock epoch on (lua/lib/epoch.lua).
-- The return is fg_give_back (lua/lib/books.lua), as lua/resync.lua's;
-- both lib files are prepended, after lua/lib/time.lua.
-- Reply: 1 the item went back now; 0 it had already gone back;
--        2 Redis never counted it: nothing to give back, recorded as returned;
--       -1 the sale is not in Redis (it is being restored: call again later,
--          the restore counts only orders that are not cancelled).

if redis.call('EXISTS', KEYS[1]) == 0 then
  return -1
end
if redis.call('SISMEMBER', KEYS[5], ARGV[1]) == 1 then
  return 0
end
local k = {remaining = KEYS[2], buyers = KEYS[3], resv = KEYS[4], released = KEYS[5]}
local owner = redis.call('HGET', k.resv, ARGV[1])
if not owner then
  fg_record_uncounted_return(k, ARGV[1], ARGV[2])
  return 2
end
fg_give_back(k, ARGV[1], owner)
fg_bump_epoch(KEYS[1])
return 1
