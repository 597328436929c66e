-- Flashgate fence read, on its own: what the failover fence reads inside
-- the deduct scripts, this Redis's replication id (`master_replid` of
-- `INFO replication`). `flashgate check --connect` runs it on every master:
-- a Redis user without `+info` could sell nothing. The read is fg_replid
-- (lua/lib/replid.lua, prepended), as in every script that reads it.
return fg_replid()
