-- Release the GPU slots of many job attempts in one round trip. Releasing what is not held is a no-op.
-- KEYS: 1 owner hash, 2 claims hash, 3 version counter, 4 fence
-- ARGV: 1 fencing token, then pairs: job id, attempt
-- Returns {"FENCED", fence} | {version, result1, result2, ...} with OK | NOT_HELD per pair
local token = tonumber(ARGV[1])
local fence = tonumber(redis.call('GET', KEYS[4]) or '0')
if token < fence then
  return {'FENCED', tostring(fence)}
end
if token > fence then
  redis.call('SET', KEYS[4], ARGV[1])
end
local out = {''}
local changed = false
for i = 2, #ARGV, 2 do
  local job, attempt = ARGV[i], ARGV[i + 1]
  local existing = redis.call('HGET', KEYS[2], job)
  local sep = existing and string.find(existing, '|', 1, true)
  if existing and string.sub(existing, 1, sep - 1) == attempt then
    local holder = job .. '/' .. attempt
    for slot in string.gmatch(string.sub(existing, sep + 1), '[^,]+') do
      if redis.call('HGET', KEYS[1], slot) == holder then redis.call('HDEL', KEYS[1], slot) end
    end
    redis.call('HDEL', KEYS[2], job)
    changed = true
    out[#out + 1] = 'OK'
  else
    out[#out + 1] = 'NOT_HELD'
  end
end
if changed then
  out[1] = tostring(redis.call('INCR', KEYS[3]))
else
  out[1] = tostring(redis.call('GET', KEYS[3]) or '0')
end
return out
