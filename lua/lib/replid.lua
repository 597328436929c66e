-- Flashgate replication id: this Redis's `master_replid`, one parser for
-- every script that reads it (each is this file, perhaps other lib files,
-- then its own body: see common/src/scripts.rs).
--
-- `master_replid` changes whenever a Redis becomes a master (a promotion,
-- every start): the failover fence compares it with a sale's `synced`, and
-- wins carry it so a replica WAIT confirms them on the same Redis. INFO's
-- replication section is short (about a microsecond), and read at most
-- once per script call.
local fg_current_replid = nil
local function fg_replid()
  fg_current_replid = fg_current_replid or string.match(redis.call('INFO', 'replication'), 'master_replid:(%x+)')
  return fg_current_replid
end
