-- Replace every claim with the ones derived from the durable job records and mark the ledger ready, unless a
-- newer leader's token is already in the fence. Cordons are kept (the health service owns them).
-- KEYS: 1 owner hash, 2 claims hash, 3 version counter, 4 ready marker, 5 fence
-- ARGV: 1 fencing token, then triples: job id, attempt, "slot,slot,..."
-- Returns {"FENCED", fence} | {"OK", version} | {"TAKEN", detail}
local token = tonumber(ARGV[1])
local fence = tonumber(redis.call('GET', KEYS[5]) or '0')
if token < fence then
  return {'FENCED', tostring(fence)}
end
local owners = {}
for i = 2, #ARGV, 3 do
  local holder = ARGV[i] .. '/' .. ARGV[i + 1]
  for slot in string.gmatch(ARGV[i + 2], '[^,]+') do
    if owners[slot] then return {'TAKEN', slot .. ' claimed by ' .. owners[slot] .. ' and ' .. holder} end
    owners[slot] = holder
  end
end
redis.call('DEL', KEYS[1], KEYS[2])
for i = 2, #ARGV, 3 do
  local holder = ARGV[i] .. '/' .. ARGV[i + 1]
  for slot in string.gmatch(ARGV[i + 2], '[^,]+') do redis.call('HSET', KEYS[1], slot, holder) end
  redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1] .. '|' .. ARGV[i + 2])
end
if token > fence then redis.call('SET', KEYS[5], ARGV[1]) end
redis.call('SET', KEYS[4], '1')
return {'OK', tostring(redis.call('INCR', KEYS[3]))}
