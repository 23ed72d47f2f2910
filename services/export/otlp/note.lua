-- Record what one batch brought for one run; returns {n, exp, closed, capped} (closed: done or dead).
-- KEYS: state, open-runs set. ARGV: run, now_ms, min_ns|'', max_ns|'', exp|'', ring, window,
-- then per item: kind ('r' record, 'e' root span event, 't' tool span), k or seq, value.
-- Python half: services/export/otlp/processor.py (_NOTE_LUA).

local st = KEYS[1]
if redis.call('HEXISTS', st, 'done') == 1 or redis.call('HEXISTS', st, 'dead') == 1 then
  return {-1, -1, 1}
end
local ring, window = tonumber(ARGV[6]), tonumber(ARGV[7])
local h = redis.call('HMGET', st, 'w', 'sc', 'rn', 'ne', 'legacy')
local w, sc, rn, ne = tonumber(h[1] or '0'), tonumber(h[2] or '0'), tonumber(h[3] or '0'), tonumber(h[4] or '0')
local legacy = h[5]
local added = 0
for i = 8, #ARGV, 3 do
  local kind, idx = ARGV[i], tonumber(ARGV[i + 1])
  if kind == 'r' then
    redis.call('HSETNX', st, 'r:' .. ARGV[i + 1], ARGV[i + 2])
    if idx >= rn then rn = idx + 1 end
  else
    local seen = legacy and (redis.call('HEXISTS', st, 'e:' .. ARGV[i + 1]) == 1
                             or redis.call('HEXISTS', st, 't:' .. ARGV[i + 1]) == 1)
    local new = false
    if idx == w and sc == 0 then
      -- in order (the usual case): every seq below is seen, none above, so no mark is needed and
      -- no slot holds a higher seq
      w = w + 1
      new = not seen
      if kind == 'e' then redis.call('HSET', st, 'v:' .. (idx % ring), ARGV[i + 2]) end
    else
      if idx >= w and not seen then
        new = redis.call('HSETNX', st, 's:' .. ARGV[i + 1], '1') == 1
        if new then sc = sc + 1 end
      end
      if kind == 'e' then
        local slot = 'v:' .. (idx % ring)
        local cur = redis.call('HGET', st, slot)
        local held = -1
        if cur then held = tonumber(string.match(cur, '^(%d+) ') or '-1') end
        if idx > held then redis.call('HSET', st, slot, ARGV[i + 2]) end
      end
    end
    if new then
      added = added + 1
      if kind == 'e' then ne = ne + 1 end
    end
  end
end
while sc > 0 and redis.call('HDEL', st, 's:' .. w) == 1 do
  w = w + 1
  sc = sc - 1
end
if sc > window then
  local low = nil
  for _, name in ipairs(redis.call('HKEYS', st)) do
    if string.sub(name, 1, 2) == 's:' then
      local q = tonumber(string.sub(name, 3))
      if low == nil or q < low then low = q end
    end
  end
  w = low
  while sc > 0 and redis.call('HDEL', st, 's:' .. w) == 1 do
    w = w + 1
    sc = sc - 1
  end
end
redis.call('HSET', st, 'w', w, 'sc', sc, 'rn', rn, 'ne', ne)
local n = redis.call('HINCRBY', st, 'n', added)
if ARGV[3] ~= '' then
  local f = redis.call('HGET', st, 'first')
  if (not f) or tonumber(ARGV[3]) < tonumber(f) then redis.call('HSET', st, 'first', ARGV[3]) end
end
if ARGV[4] ~= '' then
  local l = redis.call('HGET', st, 'last')
  if (not l) or tonumber(ARGV[4]) > tonumber(l) then redis.call('HSET', st, 'last', ARGV[4]) end
end
if ARGV[5] ~= '' then redis.call('HSET', st, 'exp', ARGV[5]) end
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
local exp = redis.call('HGET', st, 'exp')
return {n, tonumber(exp or '-1'), 0}
