-- Release every GPU slot of one job attempt. Releasing what is not held is a no-op (idempotent).
-- KEYS: 1 owner hash, 2 claims hash, 3 version counter
-- ARGV: 1 job id, 2 attempt
-- Returns {"OK", version} | {"NOT_HELD", ""}
local existing = redis.call('HGET', KEYS[2], ARGV[1])
if not existing then return {'NOT_HELD', ''} end
local sep = string.find(existing, '|', 1, true)
if string.sub(existing, 1, sep - 1) ~= ARGV[2] then return {'NOT_HELD', existing} end
local holder = ARGV[1] .. '/' .. ARGV[2]
for slot in string.gmatch(string.sub(existing, sep + 1), '[^,]+') do
  if redis.call('HGET', KEYS[1], slot) == holder then redis.call('HDEL', KEYS[1], slot) end
end
redis.call('HDEL', KEYS[2], ARGV[1])
return {'OK', tostring(redis.call('INCR', KEYS[3]))}
