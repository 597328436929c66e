-- Flashgate deduct-and-reserve: one atomic step per buy attempt.
--
-- KEYS[1] meta        hash   name, stock, per_user_limit, starts_at_ms, ends_at_ms, paused
-- KEYS[2] remaining   string items left
-- KEYS[3] buyers      hash   user -> items reserved
-- KEYS[4] idempotency string this user's Idempotency-Key that won ("won|rid");
--                            without a key, this call's own key ("rid|ts")
-- KEYS[5] stream      stream reservation records
-- KEYS[6] resv        hash   reservation id -> user
-- KEYS[7] misses      hash   this user's Idempotency-Keys that did not win -> outcome
-- KEYS[8] synced      string replication id of the Redis that agrees with the database
-- ARGV[1] user id
-- ARGV[2] Idempotency-Key ("" when the buyer sent none)
-- ARGV[3] reservation id to use if this attempt wins
-- ARGV[4] idempotency TTL, seconds
-- ARGV[5] sale id (written into the reservation record)
-- ARGV[6] most keys that did not win remembered per user and sale
-- ARGV[7] without an Idempotency-Key: a nonce of this call, so that the same
--         call sent again (the cluster client re-sends a call whose
--         connection dropped) answers the win it already made instead of
--         taking a second item
--
-- All keys share the sale's hash tag, so this runs on Redis Cluster too.
-- Reply: {outcome, detail}
--   "won"           reservation id, and two more elements: the reservation's
--                   time (Redis TIME, ms), the same `ts` as in the stream,
--                   and this Redis's replication id (`master_replid`: a
--                   replica WAIT confirms the win only on this same Redis)
--   "sold_out"      ""
--   "limit_reached" ""
--   "ended"         ""
--   "not_started"   starts_at_ms
--   "paused"        ""
--   "not_found"     ""
--   "fenced"        ""  this Redis became a master since the sale last
--                   agreed with the database (a promoted replica, a restart):
--                   it may lack the last wins, so it sells nothing until the
--                   backend has re-synced the sale (backend/src/fence.rs)
-- A replay of a remembered Idempotency-Key answers the remembered outcome
-- with "replay:" in front, e.g. "replay:won" (without the time; a won one
-- with the replication id as its third element).
--
-- Memory: a winning key is kept for the TTL (wins are bounded by the
-- stock). Keys that did not win go into one hash per user and sale, at
-- most ARGV[6] of them, expiring ARGV[4] after the last one written; past
-- that cap such a key is not remembered and a retry is answered from the
-- sale's state at that moment. So one account sending random keys cannot
-- grow Redis beyond that cap.

-- `master_replid` changes whenever a Redis becomes a master (a promotion,
-- every start): the failover fence compares it with the sale's `synced`,
-- and wins carry it. INFO's replication section is short (about a
-- microsecond), and read at most once per call.
local current_replid = nil
local function replid()
  current_replid = current_replid or string.match(redis.call('INFO', 'replication'), 'master_replid:(%x+)')
  return current_replid
end

local idem = ARGV[2]
local nonce = ARGV[7] or ''
if idem ~= '' then
  local first = redis.call('GET', KEYS[4]) or redis.call('HGET', KEYS[7], idem)
  if first then
    local sep = string.find(first, '|', 1, true)
    local outcome = string.sub(first, 1, sep - 1)
    if outcome == 'won' then
      return {'replay:won', string.sub(first, sep + 1), replid()}
    end
    return {'replay:' .. outcome, string.sub(first, sep + 1)}
  end
elseif nonce ~= '' then
  -- This very call ran before and won: the same answer, nothing taken.
  local won = redis.call('GET', KEYS[4])
  if won then
    local sep = string.find(won, '|', 1, true)
    return {'won', string.sub(won, 1, sep - 1), string.sub(won, sep + 1), replid()}
  end
end

local meta = redis.call('HMGET', KEYS[1], 'starts_at_ms', 'ends_at_ms', 'per_user_limit', 'paused')
if not meta[1] then
  return {'not_found', ''}
end

-- Remembers a final outcome under the Idempotency-Key. Outcomes that may
-- change on a later attempt (not started, paused) are not remembered.
local function final(outcome, detail)
  if idem ~= '' then
    if outcome == 'won' then
      redis.call('SET', KEYS[4], outcome .. '|' .. detail, 'EX', ARGV[4])
    elseif redis.call('HLEN', KEYS[7]) < tonumber(ARGV[6]) then
      redis.call('HSET', KEYS[7], idem, outcome .. '|' .. detail)
      redis.call('EXPIRE', KEYS[7], ARGV[4])
    end
  end
  return {outcome, detail}
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if now >= tonumber(meta[2]) then
  return final('ended', '')
end
if meta[4] == '1' then
  return {'paused', ''}
end
if now < tonumber(meta[1]) then
  return {'not_started', meta[1]}
end

-- The fence, last before the sale's counters: a sale that has ended, is
-- paused or has not started is answered as such.
if redis.call('GET', KEYS[8]) ~= replid() then
  return {'fenced', ''}
end

local user = ARGV[1]
local bought = tonumber(redis.call('HGET', KEYS[3], user) or '0')
if bought >= tonumber(meta[3]) then
  return final('limit_reached', '')
end

local left = tonumber(redis.call('GET', KEYS[2]) or '0')
if left <= 0 then
  return final('sold_out', '')
end

local rid = ARGV[3]
redis.call('DECR', KEYS[2])
redis.call('HINCRBY', KEYS[3], user, 1)
redis.call('HSET', KEYS[6], rid, user)
redis.call('XADD', KEYS[5], '*', 'rid', rid, 'sale', ARGV[5],
           'user', user, 'idem', idem, 'ts', tostring(now))
final('won', rid)
if idem == '' and nonce ~= '' then
  -- A re-sent call comes within the client's retries (well under a second).
  redis.call('SET', KEYS[4], rid .. '|' .. tostring(now), 'EX', 60)
end
-- The record's time goes back with the win, so the gateway's forward
-- carries the same reservation time as the stream entry.
return {'won', rid, tostring(now), replid()}
