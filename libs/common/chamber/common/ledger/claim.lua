-- Claim every GPU slot of one job attempt, or none (gang atomicity).
-- KEYS: 1 owner hash (slot -> job/attempt), 2 claims hash (job -> attempt|slot,slot), 3 cordon hash
--       (slot -> reason), 4 version counter, 5 ready marker
-- ARGV: 1 job id, 2 attempt, 3.. slots
-- Returns {"OK", version} | {"ALREADY", version} | {"NOT_READY"} | {code, detail}
if redis.call('EXISTS', KEYS[5]) == 0 then
  return {'NOT_READY', ''}
end
local job = ARGV[1]
local attempt = ARGV[2]
local n = #ARGV - 2
local slots = {}
for i = 1, n do slots[i] = ARGV[i + 2] end
local wanted = attempt .. '|' .. table.concat(slots, ',')
local existing = redis.call('HGET', KEYS[2], job)
if existing then
  if existing == wanted then
    return {'ALREADY', tostring(redis.call('GET', KEYS[4]) or '0')}
  end
  return {'JOB_HOLDS_OTHER_CLAIM', existing}
end
for i = 1, n do
  if redis.call('HEXISTS', KEYS[3], slots[i]) == 1 then
    return {'UNSCHEDULABLE', slots[i]}
  end
  local owner = redis.call('HGET', KEYS[1], slots[i])
  if owner then
    return {'TAKEN', slots[i] .. ' by ' .. owner}
  end
end
local holder = job .. '/' .. attempt
for i = 1, n do redis.call('HSET', KEYS[1], slots[i], holder) end
redis.call('HSET', KEYS[2], job, wanted)
return {'OK', tostring(redis.call('INCR', KEYS[4]))}
