-- Flashgate stream trim: removes the entries of a sale's stream below
-- ARGV[2] (`XTRIM MINID`), but only while the consumer group still stands
-- where the backend saw it when it chose that bound. Between that read and
-- the trim, an operator may have moved the group back (`XGROUP SETID`) or
-- deleted it, which makes entries below the bound undelivered or pending
-- again; they must stay. Checked and trimmed in one step.
--
-- KEYS[1] stream
-- ARGV[1] consumer group  ARGV[2] keep_from, an entry id `ms-seq`
-- Reply: how many entries went; -1 nothing trimmed because the stream or
--        the group is gone, the group's last-delivered id is below
--        keep_from, or an entry below keep_from is pending.

local function parse(id)
  local ms, seq = string.match(id, '^(%d+)%-(%d+)$')
  return tonumber(ms), tonumber(seq)
end

local function below(a, b)
  local am, as = parse(a)
  local bm, bs = parse(b)
  return am < bm or (am == bm and as < bs)
end

if redis.call('EXISTS', KEYS[1]) == 0 then
  return -1
end
local last = nil
for _, group in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local name, delivered
  for i = 1, #group, 2 do
    if group[i] == 'name' then
      name = group[i + 1]
    elseif group[i] == 'last-delivered-id' then
      delivered = group[i + 1]
    end
  end
  if name == ARGV[1] then
    last = delivered
  end
end
if not last or below(last, ARGV[2]) then
  return -1
end
-- Summary form: {count, smallest id, greatest id, consumers}; no pending
-- entry gives a nil (false) smallest id.
local oldest = redis.call('XPENDING', KEYS[1], ARGV[1])[2]
if oldest and below(oldest, ARGV[2]) then
  return -1
end
return redis.call('XTRIM', KEYS[1], 'MINID', ARGV[2])
