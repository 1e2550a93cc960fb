-- Release the GPU slots of ended job attempts, then claim slots for new ones, in one round trip and one atomic
-- step: what a scheduling pass does after its events freed GPUs and its decisions reused them. Releasing what
-- is not held is a no-op. Each job gets all its slots or none (gang atomicity), in order, so a later job sees
-- the claims of the earlier ones (and the slots the releases freed).
-- KEYS: 1 owner hash (slot -> job/attempt), 2 claims hash (job -> attempt|slot,slot), 3 cordon hash
--       (slot -> cordon), 4 version counter, 5 ready marker, 6 fence (the newest leader's token)
-- ARGV: 1 fencing token, 2 mode, 3 number of releases r, then r pairs: job id, attempt; then per claim: job id,
-- attempt, n, n slots. Mode `place` refuses cordoned slots; `restore` (a claim made again for a job already on
-- its GPUs, after the ledger lost it) does not, as a rebuild does not: the job is there whatever the cordon
-- says, and the cordon's rules stop it. Mode `release` takes releases only, and is not refused by a ledger that
-- lost everything (there is nothing to release there; `place` and `restore` are, before anything is written).
-- Returns {"NOT_READY"} | {"FENCED", fence} | {version, release1, ..., code1, detail1, code2, detail2, ...}
-- with OK | NOT_HELD per release, and OK | ALREADY | JOB_HOLDS_OTHER_CLAIM | UNSCHEDULABLE | TAKEN per claim, in
-- order.
local mode = ARGV[2]
if mode ~= 'release' and redis.call('EXISTS', KEYS[5]) == 0 then
  return {'NOT_READY', ''}
end
local token = tonumber(ARGV[1])
local fence = tonumber(redis.call('GET', KEYS[6]) or '0')
if token < fence then
  return {'FENCED', tostring(fence)}
end
if token > fence then
  redis.call('SET', KEYS[6], ARGV[1])
end
local out = {''}
local changed = false
local releases = tonumber(ARGV[3])
for i = 4, 3 + 2 * releases, 2 do
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
local restore = mode == 'restore'
local i = 4 + 2 * releases
while i <= #ARGV do
  local job = ARGV[i]
  local attempt = ARGV[i + 1]
  local n = tonumber(ARGV[i + 2])
  local slots = {}
  for k = 1, n do slots[k] = ARGV[i + 2 + k] end
  i = i + 3 + n
  local wanted = attempt .. '|' .. table.concat(slots, ',')
  local code, detail = 'OK', ''
  local existing = redis.call('HGET', KEYS[2], job)
  if existing then
    if existing == wanted then code = 'ALREADY' else code, detail = 'JOB_HOLDS_OTHER_CLAIM', existing end
  else
    for k = 1, n do
      if not restore and redis.call('HEXISTS', KEYS[3], slots[k]) == 1 then
        code, detail = 'UNSCHEDULABLE', slots[k]
        break
      end
      local owner = redis.call('HGET', KEYS[1], slots[k])
      if owner then
        code, detail = 'TAKEN', slots[k] .. ' by ' .. owner
        break
      end
    end
    if code == 'OK' then
      local holder = job .. '/' .. attempt
      for k = 1, n do redis.call('HSET', KEYS[1], slots[k], holder) end
      redis.call('HSET', KEYS[2], job, wanted)
      changed = true
    end
  end
  out[#out + 1] = code
  out[#out + 1] = detail
end
if changed then
  out[1] = tostring(redis.call('INCR', KEYS[4]))
else
  out[1] = tostring(redis.call('GET', KEYS[4]) or '0')
end
return out
