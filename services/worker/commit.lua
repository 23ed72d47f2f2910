-- Commits one batch atomically: run states (with a version check per run), the
-- acknowledgement of its raw entries, and every output entry (topics, runs, dead letters).
-- Either all of it happens or none of it: a worker killed before this call leaves its
-- entries pending for another worker; after it, everything is durable together.
--
-- ARGV: raw stream, group, active-runs zset, ended-state TTL ms, and one msgpack blob
--   [runs, acks, outputs] (one argument instead of thousands: building and sending each
--   argument separately cost the worker a fifth of its time):
--   runs:    {state key, expected version, state, ended (0/1), run key, last activity ms}, ...
--   acks:    raw entry ids
--   outputs: {{stream, ...}, {field, value, ...}}, ... (an event goes to two topics, one copy)
-- Returns {1} on success, or {0, i, j, ...}: the 1-based indexes of runs whose version moved.
local raw, group, active, ttl = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local batch = cmsgpack.unpack(ARGV[5])
local runs, acks, outputs = batch[1], batch[2], batch[3]

local conflicts = {0}
for r = 1, #runs do
  local current = redis.call('HGET', runs[r][1], 'v') or '0'
  if current ~= runs[r][2] then conflicts[#conflicts + 1] = r end
end
if #conflicts > 1 then return conflicts end

for r = 1, #runs do
  local run = runs[r]
  redis.call('HSET', run[1], 'v', tostring(tonumber(run[2]) + 1), 's', run[3])
  if run[4] == 1 then
    redis.call('PEXPIRE', run[1], ttl)
    redis.call('ZREM', active, run[5])
  else
    redis.call('PERSIST', run[1])
    redis.call('ZADD', active, run[6], run[5])
  end
end

local n = #acks
local i = 1
while i <= n do
  local last = math.min(i + 499, n)
  redis.call('XACK', raw, group, unpack(acks, i, last))
  i = last + 1
end

for o = 1, #outputs do
  local streams, fields = outputs[o][1], outputs[o][2]
  for s = 1, #streams do
    redis.call('XADD', streams[s], '*', unpack(fields))
  end
end
return {1}
