-- Flashgate remembered outcome: what a user's Idempotency-Key got first,
-- read without deciding anything (a retry the gateway turned away locally:
-- sold out, ended, paused), with the replication id of the Redis that
-- holds it, so a replica WAIT can confirm a remembered win there.
--
-- KEYS[1] the key's won outcome ("won|rid")  KEYS[2] the user's misses (hash)
-- ARGV[1] the Idempotency-Key
-- Reply: {"code|detail" or "", this Redis's master_replid (fg_replid,
--         lua/lib/replid.lua, prepended)}

local first = redis.call('GET', KEYS[1]) or redis.call('HGET', KEYS[2], ARGV[1]) or ''
return {first, fg_replid()}
