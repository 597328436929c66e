-- Flashgate fence: tells whether a sale is fenced on the Redis that holds
-- it, and lifts the fence once the backend has re-synced the sale.
--
-- A sale is fenced while `synced` differs from this Redis's replication id
-- (`master_replid`, new whenever a Redis becomes a master: a promotion, a
-- start). Such a Redis may lack the last writes the database already
-- holds orders for; lua/deduct_batch.lua sells nothing of a fenced sale.
--
-- KEYS[1] meta  KEYS[2] synced
-- ARGV[1] ""  to ask only; or the replication id the caller re-synced the
--         sale on: the fence is lifted only if that is still this Redis's
--         (a second failover during the re-sync leaves it fenced)
-- Reply: {this Redis's replication id, the sale's `synced` or "",
--         1 if the sale is here else 0, 1 if the fence was lifted now else 0}
-- The replication id is fg_replid (lua/lib/replid.lua, prepended).

local replid = fg_replid()
local synced = redis.call('GET', KEYS[2]) or ''
local present = redis.call('EXISTS', KEYS[1])
local lifted = 0
if ARGV[1] ~= '' and ARGV[1] == replid and present == 1 then
  redis.call('SET', KEYS[2], replid)
  lifted = 1
end
return {replid, synced, present, lifted}
