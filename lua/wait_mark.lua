-- Flashgate replica-wait mark: a write, so that the `WAIT` sent right after
-- it on the same connection covers everything this Redis wrote before it
-- (replication is one ordered stream per master), whichever connection
-- wrote it: the wins of every gateway, the re-sends of a reconnected
-- client. Answers this Redis's replication id: a win is confirmed only if
-- it was made on the same Redis.
--
-- KEYS[1] the mark (in the sale's hash tag on a cluster)
-- Reply: this Redis's master_replid (fg_replid, lua/lib/replid.lua,
--        prepended)

redis.call('SET', KEYS[1], '1', 'PX', 60000)
return fg_replid()
