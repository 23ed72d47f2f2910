-- Commits one batch atomically: run states (with a version check per run), their held
-- (out-of-order) entries and pending tool calls one by one, the acknowledgement of its raw entries, and every output
-- entry (topics, runs, dead letters, control entries). Either all of it happens or none of it:
-- a worker killed before this call leaves its entries pending for another worker; after it,
-- everything is durable together. Python half: services/worker/commit.py.
--
-- KEYS[1]: the shard's raw stream (every key below lives in its slot in cluster mode).
-- ARGV: group, the shard's active-runs zset, ended-state TTL ms, and one msgpack blob
--   [runs, acks, outputs] (one argument instead of thousands: building and sending each
--   argument separately cost the worker a fifth of its time):
--   runs:    {key (the state hash), version (expected), state, ended (0/1), run (its key), last_ms
--             (last activity), held_set {field, value, ...}, held_del {field, ...}}, ...: held
--             entries (h:<seq>) and pending tool calls' blocks (c:<key>), written once, deleted once
--             (commit.py's RunArgs: the same names, in this order)
--   acks:    raw entry ids
--   outputs: {{stream, ...}, {field, value, ...}}, ... (an event goes to two topics, one copy)
--   then the shard's lease key, the committing worker ("" and "": no lease is checked), the
--   lease's ttl ms, and CLAIM_IDLE_MS.
-- Returns {COMMITTED} on success, {CONFLICT, i, j, ...}: the 1-based indexes of runs whose version
-- moved, {LEASE_LOST}: the shard's lease names another worker (or nobody, see below), so this worker
-- may not commit for it, or {RETAKEN}: success, after taking back the shard's lease. The codes are
-- commit.py's ReplyCode (tests/worker/test_commit_lua_names.py holds them equal).
--
-- A lease that expired under the batch and that nobody took is taken back when every entry the
-- batch acknowledges is still pending to this worker (the lease's owner is the group's consumer
-- name): no other worker claimed them, so none can have processed them, and whatever another
-- worker committed to the same runs meanwhile is caught by the version check below. Without
-- acknowledgements (an abandon marker) there is nothing to prove it: {LEASE_LOST}. A lease given
-- back (`released:<owner>`, services/worker/leases.py) is never taken back here.
--
-- When the commit is refused, the batch's entries that are still pending to this worker are made
-- idle for CLAIM_IDLE_MS (XCLAIM to itself with IDLE and JUSTID: owner and delivery count stay):
-- the shard's owner then reclaims them at its next sweep, instead of CLAIM_IDLE_MS after this read
-- (e.g. a read in flight while the shard was given back, or a batch that outlasted a failover).
local COMMITTED, CONFLICT, LEASE_LOST, RETAKEN = 1, 0, 2, 3
local raw = KEYS[1]
local group, active, ttl = ARGV[1], ARGV[2], ARGV[3]
local lease, owner, lease_ttl, claim_idle = ARGV[5], ARGV[6], tonumber(ARGV[7]) or 0, tonumber(ARGV[8]) or 0
local batch = cmsgpack.unpack(ARGV[4])
local runs, acks, outputs = batch[1], batch[2], batch[3]
local CHUNK = 500  -- arguments per command (unpack of thousands overflows Lua's C stack)

local function mine(id)
  return #redis.call('XPENDING', raw, group, id, id, 1, owner) > 0
end
local function refuse()
  if claim_idle > 0 then
    for a = 1, #acks do
      if mine(acks[a]) then redis.call('XCLAIM', raw, group, owner, 0, acks[a], 'IDLE', claim_idle, 'JUSTID') end
    end
  end
  return {LEASE_LOST}
end

local retaken = false
if lease ~= '' then
  local holder = redis.call('GET', lease)
  if holder ~= owner then
    if holder or #acks == 0 or lease_ttl <= 0 then return refuse() end
    for a = 1, #acks do
      if not mine(acks[a]) then return refuse() end
    end
    retaken = true
  end
end

-- Redis does not roll a script back when a command fails halfway, so everything that could make
-- a write fail is checked first: versions, and the type of every key written.
local conflicts = {CONFLICT}
for r = 1, #runs do
  local key, version = unpack(runs[r], 1, 2)  -- the first two of a run's fields (below)
  local current = redis.call('HGET', key, 'v') or '0'  -- a key of another type fails here
  if current ~= version then conflicts[#conflicts + 1] = r end
  if tonumber(version) == nil then return redis.error_reply('ERR run ' .. r .. ': version is not a number') end
end
if #conflicts > 1 then return conflicts end

local function expect(key, kind)
  local t = redis.call('TYPE', key)['ok']
  if t ~= 'none' and t ~= kind then return redis.error_reply('ERR ' .. key .. ' is a ' .. t .. ', not a ' .. kind) end
  return nil
end
local err = expect(raw, 'stream') or expect(active, 'zset')
if err then return err end
local checked = {}
for o = 1, #outputs do
  local streams = outputs[o][1]
  for s = 1, #streams do
    if not checked[streams[s]] then
      checked[streams[s]] = true
      err = expect(streams[s], 'stream')
      if err then return err end
    end
  end
end

local function chunked(cmd, key, items, step)
  local n = #items
  local i = 1
  while i <= n do
    local last = math.min(i + step - 1, n)
    redis.call(cmd, key, unpack(items, i, last))
    i = last + 1
  end
end

-- The active-runs index is written once per batch (one ZADD, one ZREM), not once per run: with
-- thousands of active runs a batch carries one line of each, and a command per run per batch was
-- a third of the script's time. A state written not ended carries no TTL (only an end sets one, and
-- an ended run is never written back as running), so it needs no PERSIST.
local touched, finished = {}, {}
for r = 1, #runs do
  -- A run's fields, named once, in the order of commit.py's RunArgs (the same names).
  local key, version, state, ended, run, last_ms, held_set, held_del = unpack(runs[r])
  redis.call('HSET', key, 'v', tostring(tonumber(version) + 1), 's', state)
  if #held_del > 0 then chunked('HDEL', key, held_del, CHUNK) end
  if #held_set > 0 then chunked('HSET', key, held_set, CHUNK) end  -- CHUNK is even: pairs stay whole
  if ended == 1 then
    redis.call('PEXPIRE', key, ttl)
    finished[#finished + 1] = run
  else
    touched[#touched + 1] = last_ms
    touched[#touched + 1] = run
  end
end
if #touched > 0 then chunked('ZADD', active, touched, CHUNK) end  -- score, member pairs
if #finished > 0 then chunked('ZREM', active, finished, CHUNK) end

local n = #acks
local i = 1
while i <= n do
  local last = math.min(i + CHUNK - 1, n)
  redis.call('XACK', raw, group, unpack(acks, i, last))
  i = last + 1
end

for o = 1, #outputs do
  local streams, fields = outputs[o][1], outputs[o][2]
  for s = 1, #streams do
    redis.call('XADD', streams[s], '*', unpack(fields))
  end
end
if retaken then
  redis.call('SET', lease, owner, 'PX', lease_ttl)  -- last: a refused commit above takes nothing
  return {RETAKEN}
end
return {COMMITTED}
