-- Flashgate deduct-and-reserve: the concurrent buy attempts of one sale
-- (or of one bucket of a bucketed sale) in ONE script call, each decided
-- atomically, in order, as if sent alone after the ones before it.
--
-- An EVALSHA costs Redis far more than deciding one attempt; the gateway
-- groups the attempts that arrive while a call of the same sale is in
-- flight (gateway/src/buy/deduct/batch.rs) and sends them here together
-- (an attempt with nothing to wait for goes alone: N = 1). Each attempt is
-- decided by fg_deduct (lua/lib/deduct.lua, with the shared rules fg_* of
-- lua/lib/decide.lua; both are prepended): its own outcome,
-- Idempotency-Key, nonce and reservation. So a later attempt of the call
-- sees what an earlier one did: the stock it took (sold_out once none is
-- left), the user's count (limit_reached), the outcome its key remembers
-- (the same key twice: the second is a replay of the first).
--
-- Shared keys, once (all keys share the sale's hash tag, or the bucket's:
-- one slot, so this runs on Redis Cluster too):
-- KEYS[1] meta        hash   name, stock, per_user_limit, starts_at_ms,
--                            ends_at_ms, paused, draw_window_ms, epoch
-- KEYS[2] remaining   string items left
-- KEYS[3] buyers      hash   user -> items reserved
-- KEYS[4] stream      stream reservation records
-- KEYS[5] resv        hash   reservation id -> user
-- KEYS[6] synced      string replication id of the Redis that agrees with
--                            the database
-- KEYS[7] draw state   hash  the opening draw (see lua/draw_run.lua); KEYS[7..10]
--                            are left out when the sale has no draw (a
--                            bucket, a cluster): then KEYS holds 6 shared keys
-- KEYS[8] draw entries hash  entry number -> entrant (JSON), in arrival order
-- KEYS[9] draw index   hash  entrant name (user and key or nonce) -> entry
--                            number; c:<len>:<user> -> that user's entries
-- KEYS[10] draw outcomes hash entry number -> outcome (JSON)
-- then per attempt i (1-based), after the S shared keys (6 or 10):
-- KEYS[S + 2i - 1] idempotency string this user's Idempotency-Key that won
--                              ("won|rid"); without a key, this call's own
--                              key ("rid|ts")
-- KEYS[S + 2i]     misses      hash   this user's Idempotency-Keys that did
--                              not win -> outcome
--
-- ARGV[1] the number of attempts N
-- then per attempt i, its nine ARGV[2 + 9(i-1) .. 1 + 9i]:
--   1 user id
--   2 Idempotency-Key ("" when the buyer sent none)
--   3 reservation id to use if this attempt wins
--   4 idempotency TTL, seconds
--   5 sale id (written into the reservation record)
--   6 most keys that did not win remembered per user and sale
--   7 without an Idempotency-Key: a nonce of this call, so that the same
--     call sent again (the cluster client re-sends a call whose connection
--     dropped) answers the win it already made instead of taking a second
--     item. Empty: no such guard, and a draw entry of such a call has no
--     name in the draw index (never joined again)
--   8 `[fairness] window_ms` of the caller: the draw window of a sale whose
--     meta has no `draw_window_ms` of its own (0 or absent: none)
--   9 "1" when the keys are one bucket of a bucketed sale (its home bucket
--     for this user, see common/src/buckets.rs), 5 still the sale's id: a
--     `sold_out` is then not remembered under the Idempotency-Key, since
--     the gateway moves items into the bucket (lua/xfer_*.lua) and runs
--     this again with the same key; once every bucket is confirmed dry it
--     runs it once more with "0", so that the key's `sold_out` is
--     remembered like any final answer
--
-- Reply: N elements, the i-th attempt's {outcome, detail}:
--   "won"           reservation id, and two more elements: the reservation's
--                   time (Redis TIME, ms), the same `ts` as in the stream,
--                   and this Redis's replication id (`master_replid`: a
--                   replica WAIT confirms the win only on this same Redis)
--   "sold_out"      "", and the sale's stock epoch (its meta's `epoch`,
--                   "0" when unset): the gateway flags the sale sold out
--                   only if it knows no newer epoch (lua/release.lua)
--   "limit_reached" ""
--   "ended"         ""
--   "not_started"   starts_at_ms
--   "paused"        ""
--   "not_found"     ""
--   "entered"       entry number, and the ms left until the draw closes:
--                   the buy arrived within the sale's draw window and waits
--                   for lua/draw_run.lua to decide it
--                   (also for this same call re-sent: see below)
--   "joined"        the same for a replay of a buy the draw already holds
--                   (same Idempotency-Key): no new entry
--   "draw_pending"  ""  the draw window has closed but the draw is not
--                   decided yet: run lua/draw_run.lua, then buy again (no
--                   buy after the window may take an item before the draw)
--   "fenced"        ""  this Redis became a master since the sale last
--                   agreed with the database (a promoted replica, a restart):
--                   it may lack the last wins, so it sells nothing until the
--                   backend has re-synced the sale (backend/src/fence.rs)
--   "error"         message: the attempt raised an error (a failed
--                   redis.call, a bad argument); the attempts after it are
--                   still decided: one attempt's error is never the call's
-- A replay of a remembered Idempotency-Key answers the remembered outcome
-- with "replay:" in front, e.g. "replay:won" (without the time; a won one
-- with the replication id as its third element).
-- The same call re-sent (no Idempotency-Key, the same nonce) is never a
-- replay: it answers what its first send got ("won" with its time,
-- "entered" for the draw entry it made, the draw's outcome once decided).
-- In the draw, a user's entries are capped at the per-user limit (counted
-- in the draw index under fg_draw_count_name): a further key is answered
-- "limit_reached" at once, remembered like any final outcome.
-- An error of the node (READONLY, NOREPLICAS, ...: see NODE_LEVEL below)
-- is the whole call's error reply instead, whatever the attempt. (Not an
-- error reply nested in the array: client libraries turn any nested error
-- into the whole call's error.) Writes an attempt made before its error
-- stay.
--
-- `master_replid` (fg_replid), the sale's meta, its `synced` fence and
-- the time are read once per call, not per attempt (fg_call in
-- lua/lib/deduct.lua): no attempt changes them, and the attempts of one
-- call are decided at one instant (their wins share one reservation
-- `ts`). The items left and the draw's state are read once per call too,
-- the items left then followed through the call's own wins, the draw's
-- state read again after an attempt opened the draw (lua/lib/decide.lua
-- `fg_left`, lua/lib/deduct.lua).
--
-- Memory: a winning key is kept for the TTL (wins are bounded by the
-- stock). Keys that did not win go into one hash per user and sale, at
-- most argument 6 of them, expiring argument 4 after the last one written;
-- past that cap such a key is not remembered and a retry is answered from
-- the sale's state at that moment. So one account sending random keys
-- cannot grow Redis beyond that cap.

local n = tonumber(ARGV[1])
if not n or n < 0 then
  return redis.error_reply('deduct_batch: ARGV[1] must be the number of attempts')
end
local shared = #KEYS - 2 * n
if (shared ~= 6 and shared ~= 10) or #ARGV ~= 1 + 9 * n then
  return redis.error_reply('deduct_batch: ' .. #KEYS .. ' keys and ' .. #ARGV .. ' args for ' .. n .. ' attempts')
end

-- The keys of one attempt as fg_deduct takes them: the shared ones, its
-- idempotency key at K[4] and its misses hash at K[7] (see
-- lua/lib/deduct.lua).
local K = {KEYS[1], KEYS[2], KEYS[3], false, KEYS[4], KEYS[5], false, KEYS[6]}
if shared == 10 then
  K[9], K[10], K[11], K[12] = KEYS[7], KEYS[8], KEYS[9], KEYS[10]
end

-- Errors that say "not on this node, not now" rather than "not this
-- attempt": the node is a replica (READONLY), lacks its replicas
-- (NOREPLICAS), cannot persist (MISCONF), is out of memory (OOM), lost its
-- master (MASTERDOWN), or its cluster is down. They are the whole call's
-- error reply, not one attempt's: the client must see the node's error as
-- from any other call, so that a Sentinel client looks the primary up
-- again and the circuit breaker counts a failure. Redis raises them at a write (OOM
-- only before the script's first write), and the node's state does not
-- change while a script runs, so the call's first write is the one that
-- fails: the attempts before it wrote nothing. Had one written (a win),
-- its writes are durable and its buyer gets the error exactly as after a
-- timeout: the win is in the stream (the backend writes its order) and a
-- retry with its Idempotency-Key replays it. (A refusal at the per-user
-- limit writes too, and undoes it: its buyer gets the error, and a retry
-- is refused again.)
local NODE_LEVEL = {'READONLY', 'NOREPLICAS', 'MISCONF', 'OOM', 'MASTERDOWN', 'CLUSTERDOWN'}
local function node_level(message)
  local code = string.match(message, '^%-?(%u+)')
  for _, c in ipairs(NODE_LEVEL) do
    if code == c then
      return true
    end
  end
  -- A script's command on a cluster that is down answers ERR, by message.
  return string.find(message, 'cluster is down', 1, true) ~= nil
end

local replies = {}
local A = {}
for i = 1, n do
  K[4] = KEYS[shared + 2 * i - 1]
  K[7] = KEYS[shared + 2 * i]
  local base = 1 + 9 * (i - 1)
  for j = 1, 9 do
    A[j] = ARGV[base + j]
  end
  local ok, reply = pcall(fg_deduct, K, A)
  if ok then
    replies[i] = reply
  else
    -- redis.call raises a table {err = ...}; Lua itself a string.
    local message = type(reply) == 'table' and tostring(reply.err) or tostring(reply)
    if node_level(message) then
      return redis.error_reply(message)
    end
    replies[i] = {'error', message}
  end
end
return replies
