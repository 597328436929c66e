-- Flashgate deduct-and-reserve for the concurrent buy attempts of one sale
-- (or of one bucket of a bucketed sale) in ONE script call.
--
-- An EVALSHA costs Redis far more than what lua/deduct.lua does per
-- attempt; the gateway groups the attempts that arrive while a call of
-- the same sale is in flight (gateway/src/buy/deduct/batch.rs) and sends them
-- here together. Each attempt is decided in order, atomically, by the very
-- function lua/deduct.lua runs (fg_deduct, lua/lib/deduct.lua): its own
-- outcome, Idempotency-Key, nonce and reservation, exactly as the same
-- attempts sent one by one in that order. So a later attempt of the batch
-- sees what an earlier one did: the stock it took (sold_out once none is
-- left), the user's count (limit_reached), the outcome its key remembers
-- (the same key twice: the second is a replay of the first).
--
-- Shared keys, once (all keys share one hash tag: one slot on a cluster):
-- KEYS[1] meta
-- KEYS[2] remaining
-- KEYS[3] buyers
-- KEYS[4] stream
-- KEYS[5] resv
-- KEYS[6] synced
-- KEYS[7..10] draw state, entries, index, outcomes; left out when the sale
--             has no draw (a bucket, a cluster): then KEYS holds 6 shared keys
-- then per attempt i (1-based), after the S shared keys (6 or 10):
-- KEYS[S + 2i - 1] its idempotency key (its Idempotency-Key's, or without
--                  one this call's own key)
-- KEYS[S + 2i]     its user's misses hash
-- (each as KEYS[4] and KEYS[7] of lua/deduct.lua).
--
-- ARGV[1] the number of attempts N
-- then per attempt i, ARGV[2 + 9(i-1) .. 1 + 9i]: its ARGV[1..9] of
-- lua/deduct.lua (user, Idempotency-Key, reservation id, TTL, sale id,
-- misses cap, nonce, draw window, bucket flag).
--
-- Reply: N elements, the i-th attempt's reply in the shapes of
-- lua/deduct.lua. An attempt that raises an error (a failed redis.call, a
-- bad argument) is answered {"error", message}, and the attempts after it
-- are still decided: one attempt's error is never the batch's. Except an
-- error of the node (READONLY, NOREPLICAS, ...: see NODE_LEVEL below),
-- which is the whole call's error reply, as from lua/deduct.lua. (Not an
-- error reply nested in the array: client libraries turn any nested error
-- into the whole call's error.) As with one call per attempt, writes an
-- attempt made before its error stay.
--
-- `master_replid` (fg_replid), the sale's meta, its `synced` fence and
-- the time are read once per call, not per attempt (fg_call in
-- lua/lib/deduct.lua): no attempt changes them, and the attempts of one
-- call are decided at one instant (their wins share one reservation
-- `ts`). The draw's state is read per attempt: an earlier one may open it.

local n = tonumber(ARGV[1])
if not n or n < 0 then
  return redis.error_reply('deduct_batch: ARGV[1] must be the number of attempts')
end
local shared = #KEYS - 2 * n
if (shared ~= 6 and shared ~= 10) or #ARGV ~= 1 + 9 * n then
  return redis.error_reply('deduct_batch: ' .. #KEYS .. ' keys and ' .. #ARGV .. ' args for ' .. n .. ' attempts')
end

-- The keys of one attempt, in lua/deduct.lua's layout.
local K = {KEYS[1], KEYS[2], KEYS[3], false, KEYS[4], KEYS[5], false, KEYS[6]}
if shared == 10 then
  K[9], K[10], K[11], K[12] = KEYS[7], KEYS[8], KEYS[9], KEYS[10]
end

-- Errors that say "not on this node, not now" rather than "not this
-- attempt": the node is a replica (READONLY), lacks its replicas
-- (NOREPLICAS), cannot persist (MISCONF), is out of memory (OOM), lost its
-- master (MASTERDOWN), or its cluster is down. They are the whole call's
-- error reply, not one attempt's: the client must see what it sees from
-- lua/deduct.lua, so that a Sentinel client looks the primary up again and
-- the circuit breaker counts a failure. Redis raises them at a write (OOM
-- only before the script's first write), and the node's state does not
-- change while a script runs, so the call's first write is the one that
-- fails: the attempts before it wrote nothing. Had one written (a win),
-- its writes are durable and its buyer gets the error exactly as after a
-- timeout: the win is in the stream (the backend writes its order) and a
-- retry with its Idempotency-Key replays it.
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
for i = 1, n do
  K[4] = KEYS[shared + 2 * i - 1]
  K[7] = KEYS[shared + 2 * i]
  local base = 1 + 9 * (i - 1)
  local A = {}
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
