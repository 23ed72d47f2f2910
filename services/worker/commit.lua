-- Commits one batch atomically: run states (with a version check per run), the
-- acknowledgement of its raw entries, and every output entry (topics, runs, dead letters).
-- Either all of it happens or none of it: a worker killed before this call leaves its
-- entries pending for another worker; after it, everything is durable together.
--
-- ARGV: raw stream, group, active-runs zset, ended-state TTL ms,
--       nruns, then per run: state key, expected version, state, ended (0/1), run key, last activity ms
--       acknowledged ids, space-separated, in one argument
--       nadds, then per output: nstreams, stream..., nfields, field, value, ...
-- Returns {1} on success, or {0, i, j, ...}: the 1-based indexes of runs whose version moved.
local i = 1
local raw, group, active, ttl = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
i = 5
local nruns = tonumber(ARGV[i]); i = i + 1
local first = i
local conflicts = {0}
for r = 1, nruns do
  local current = redis.call('HGET', ARGV[i], 'v') or '0'
  if current ~= ARGV[i + 1] then conflicts[#conflicts + 1] = r end
  i = i + 6
end
if #conflicts > 1 then return conflicts end

i = first
for r = 1, nruns do
  local key = ARGV[i]
  redis.call('HSET', key, 'v', tostring(tonumber(ARGV[i + 1]) + 1), 's', ARGV[i + 2])
  if ARGV[i + 3] == '1' then
    redis.call('PEXPIRE', key, ttl)
    redis.call('ZREM', active, ARGV[i + 4])
  else
    redis.call('PERSIST', key)
    redis.call('ZADD', active, ARGV[i + 5], ARGV[i + 4])
  end
  i = i + 6
end

-- Acknowledgements arrive as one space-separated argument (one argument instead of hundreds).
local acks = {}
for id in string.gmatch(ARGV[i], '%S+') do
  acks[#acks + 1] = id
  if #acks == 500 then
    redis.call('XACK', raw, group, unpack(acks))
    acks = {}
  end
end
if #acks > 0 then redis.call('XACK', raw, group, unpack(acks)) end
i = i + 1

-- Each output: nstreams, stream..., nfields, field, value, ... (an event goes to two topics
-- with one copy of its fields).
local nadds = tonumber(ARGV[i]); i = i + 1
for _ = 1, nadds do
  local nstreams = tonumber(ARGV[i])
  local fi = i + 1 + nstreams
  local nfields = tonumber(ARGV[fi])
  for s = 1, nstreams do
    redis.call('XADD', ARGV[i + s], '*', unpack(ARGV, fi + 1, fi + nfields))
  end
  i = fi + 1 + nfields
end
return {1}
