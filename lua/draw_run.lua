-- Flashgate opening draw: decides, for the whole sale, every buy that
-- entered within the sale's draw window (lua/deduct_batch.lua answered them
-- "entered"), in an order drawn from a random seed and independent of
-- arrival, each by the rules of any other buy (lua/lib/decide.lua,
-- prepended). Whichever gateway calls first after the window closes fixes
-- the seed; every call (from any gateway, any number at once) decides the
-- next chunk, so one call never blocks Redis long and a gateway dying
-- mid-draw leaves the rest to the next caller. Idempotent: a call after the
-- last chunk changes nothing.
--
-- The order (reproducible from the record, see docs/RELIABILITY.md): with
-- n entrants numbered 1..n in arrival order and the array p = 1..n, for
-- i = 1..n: r = the first 13 hex digits of SHA1(seed .. ":" .. i) as an
-- integer, j = i + r mod (n - i + 1), swap p[i] and p[j]; p[i] is the
-- i-th entrant decided. (A forward Fisher-Yates shuffle; the array is kept
-- sparse in KEYS[10], only the positions swapped.)
--
-- KEYS[1] meta  KEYS[2] remaining  KEYS[3] buyers  KEYS[4] stream
-- KEYS[5] resv  KEYS[6] synced
-- KEYS[7] draw state     hash  closes_at_ms, opened_at_ms, seed, entrants,
--                              cursor, decided_at_ms, done, finished_at_ms
-- KEYS[8] draw entries   hash  entry number -> {user, idem, nonce, rid, at}
-- KEYS[9] draw outcomes  hash  entry number -> {o, d, ts, node}
-- KEYS[10] draw perm     hash  the shuffle's swapped positions (while running)
-- KEYS[11] draw order    list  entry numbers in the order decided
-- KEYS[12] draw index    hash  entrant name -> entry number (and per-user
--                              entry counts, see lua/deduct_batch.lua)
-- ARGV[1] a random seed (hex) offered by the caller; kept only by the first
--         call after the window closed, so nobody knows it while buys enter
-- ARGV[2] most entrants decided by this call
-- ARGV[3] idempotency TTL, seconds (the record is kept this long)
-- ARGV[4] sale id
-- ARGV[5] most keys that did not win remembered per user and sale
-- ARGV[6..8] the prefixes of a buyer's keys in the sale, made by
--         common/src/keys.rs (`BuyerKeyPrefixes`): Idempotency-Key,
--         call, misses. An entrant's keys, which only this call learns
--         (they are in the sale's slot), are named by its one rule: the
--         prefix, the user id, and for the first two `:` and the key or
--         nonce (buyer_key below)
-- Reply: {state, detail}
--   "none"      ""  the sale has no draw
--   "open"      ms left until the window closes (nothing decided)
--   "not_found" ""  the sale is not in Redis
--   "paused"    ""  nothing decided until the sale is resumed
--   "fenced"    ""  nothing decided until the backend re-synced the sale
--   "pending"   entrants decided so far (call again)
--   "done"      entrants (every one decided)

local state = redis.call('HMGET', KEYS[7], 'closes_at_ms', 'done', 'seed', 'entrants', 'cursor')
if not state[1] then
  return {'none', ''}
end
if state[2] == '1' then
  return {'done', state[4]}
end
local meta = redis.call('HMGET', KEYS[1], 'starts_at_ms', 'ends_at_ms', 'per_user_limit', 'paused')
if not meta[1] then
  return {'not_found', ''}
end
local now = fg_now_ms()
local closes = tonumber(state[1])
if now < closes then
  return {'open', tostring(closes - now)}
end
-- As in lua/deduct_batch.lua: ended first, then paused, then the fence.
local ended = now >= tonumber(meta[2])
if not ended then
  if meta[4] == '1' then
    return {'paused', ''}
  end
  if redis.call('GET', KEYS[6]) ~= fg_replid() then
    return {'fenced', ''}
  end
end

local seed, n, cursor = state[3], tonumber(state[4]), tonumber(state[5] or '0')
if not seed then
  seed, n, cursor = ARGV[1], redis.call('HLEN', KEYS[8]), 0
  redis.call('HSET', KEYS[7], 'seed', seed, 'entrants', n, 'cursor', 0, 'decided_at_ms', now)
end
-- A draw never finished (every gateway gone, the sale paused for ever) is
-- not kept for ever: its keys expire as lua/deduct_batch.lua's do, an hour past
-- the idempotency TTL, and the last call sets the record's final TTL.
-- The outcomes, order and shuffle's positions keys are written by the
-- loop below: each gets it right after this call's first write to it, so
-- a call failing later in the loop leaves none of them without a TTL.
local keep = tonumber(ARGV[3]) + 3600
local perm_kept = false

local k = {remaining = KEYS[2], buyers = KEYS[3], stream = KEYS[4], resv = KEYS[5]}
local limit = tonumber(meta[3])
local now_s = tostring(now)
local idem_prefix, call_prefix, misses_prefix = ARGV[6], ARGV[7], ARGV[8]
-- An entrant's key of one buy (common/src/keys.rs, `BuyerKeyPrefixes`).
local function buyer_key(prefix, user, of)
  return prefix .. user .. ':' .. of
end
local last = math.min(n, cursor + tonumber(ARGV[2]))
for i = cursor + 1, last do
  local r = tonumber(string.sub(redis.sha1hex(seed .. ':' .. i), 1, 13), 16)
  local j = i + math.fmod(r, n - i + 1)
  local at_i = tonumber(redis.call('HGET', KEYS[10], i) or i)
  local at_j = at_i
  if j ~= i then
    at_j = tonumber(redis.call('HGET', KEYS[10], j) or j)
  end
  local e = cjson.decode(redis.call('HGET', KEYS[8], at_j))
  local idem_key
  if e.idem ~= '' then
    idem_key = buyer_key(idem_prefix, e.user, e.idem)
  else
    idem_key = buyer_key(call_prefix, e.user, e.nonce)
  end
  local a = {user = e.user, idem = e.idem, rid = e.rid, idem_key = idem_key,
             misses_key = misses_prefix .. e.user, ttl = ARGV[3],
             misses_cap = tonumber(ARGV[5]), sale = ARGV[4]}
  local outcome
  if ended then
    fg_final(a, 'ended', '')
    outcome = 'ended'
  else
    outcome = fg_take(k, a, limit, now_s)
  end
  -- The entrant's user and rid: a gateway holding this entry number checks
  -- the outcome is its own (numbers are reused after a failover lost entries).
  local record = {o = outcome, d = '', ts = now, user = e.user, rid = e.rid}
  if outcome == 'won' then
    record.d = e.rid
    record.node = fg_replid()
  end
  redis.call('HSET', KEYS[9], at_j, cjson.encode(record))
  redis.call('RPUSH', KEYS[11], at_j)
  if i == cursor + 1 then
    redis.call('EXPIRE', KEYS[9], keep)
    redis.call('EXPIRE', KEYS[11], keep)
  end
  -- The shuffle's state and the cursor move with each entrant, after its
  -- decision: a runtime error later in this call leaves every entrant
  -- decided so far decided, and the next call goes on after the last one,
  -- never deciding one twice.
  if j ~= i then
    redis.call('HSET', KEYS[10], j, at_i)
    if not perm_kept then
      redis.call('EXPIRE', KEYS[10], keep)
      perm_kept = true
    end
  end
  redis.call('HDEL', KEYS[10], i)
  redis.call('HSET', KEYS[7], 'cursor', i)
end
if last < n then
  return {'pending', tostring(last)}
end
redis.call('HSET', KEYS[7], 'done', '1', 'finished_at_ms', now)
redis.call('DEL', KEYS[10])
-- The record answers retries and audits for the idempotency TTL.
for _, key in ipairs({KEYS[7], KEYS[8], KEYS[9], KEYS[11], KEYS[12]}) do
  redis.call('EXPIRE', key, ARGV[3])
end
return {'done', tostring(n)}
