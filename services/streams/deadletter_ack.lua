-- Dead letters and the acknowledgement of their entries, all or nothing. A MULTI would run its
-- XACKs even when an XADD in it fails (a dead-letter key holding another type: Redis does not roll a
-- transaction back), acknowledging an entry whose dead letter was never written. Here the first
-- XADD is tried before anything is acknowledged: when it fails (WRONGTYPE; OOM at maxmemory, before
-- any write) nothing is written and the error is the reply. The later XADDs go to the same key.
-- The retention of dead letters is written here too, the one rule for every consumer's: each XADD
-- trims its stream to the letters newer than MINID (approximately: whole radix-tree nodes, cheap),
-- DEADLETTER_RETENTION_HOURS before now, so no dead-letter stream grows until an operator trims it.
-- KEYS: the dead-letter stream, then the streams acknowledged (one shard: one hash slot).
-- ARGV: group, MINID ("": no trim), letter count, then per letter its field count (names and
-- values) and the fields, then per acknowledged stream (in KEYS order) its id count and the ids.
-- Python half: services/streams/deadletter.py (DeadLetterWriter).

local dead, group, minid = KEYS[1], ARGV[1], ARGV[2]
local i = 4
for _ = 1, tonumber(ARGV[3]) do
  local n = tonumber(ARGV[i])
  local reply
  if minid ~= '' then
    reply = redis.pcall('XADD', dead, 'MINID', '~', minid, '*', unpack(ARGV, i + 1, i + n))
  else
    reply = redis.pcall('XADD', dead, '*', unpack(ARGV, i + 1, i + n))
  end
  if type(reply) == 'table' and reply.err then
    return redis.error_reply(reply.err .. ' (dead-letter stream ' .. dead .. ': nothing acknowledged)')
  end
  i = i + n + 1
end
for k = 2, #KEYS do
  local n = tonumber(ARGV[i])
  local j = 1
  while j <= n do
    local last = math.min(j + 999, n)  -- unpack's stack limit
    redis.call('XACK', KEYS[k], group, unpack(ARGV, i + j, i + last))
    j = last + 1
  end
  i = i + n + 1
end
return 1
