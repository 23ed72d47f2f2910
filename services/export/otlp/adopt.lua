-- Adopt a run's state from an exporter of before (one state for every group) into this group's:
-- moved as it is, marked legacy. KEYS: old state, old open set, new state, new open set. ARGV: run.
-- Python half: services/export/otlp/processor.py (_ADOPT_LUA).

local score = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not score then return 0 end
if redis.call('EXISTS', KEYS[1]) == 1 and redis.call('EXISTS', KEYS[3]) == 0 then
  redis.call('RENAME', KEYS[1], KEYS[3])
  -- the seqs seen so far without a gap become the watermark: only later ones need marks
  local w = 0
  while redis.call('HEXISTS', KEYS[3], 'e:' .. w) == 1 or redis.call('HEXISTS', KEYS[3], 't:' .. w) == 1 do
    w = w + 1
  end
  redis.call('HSET', KEYS[3], 'legacy', '1', 'w', w)
  redis.call('ZADD', KEYS[4], score, ARGV[1])
end
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
