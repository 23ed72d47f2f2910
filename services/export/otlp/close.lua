-- Close a run's state after its root is out (or its export is dead): keep only the verdict.
-- KEYS: state, open-runs set. ARGV: run, field ('done'|'dead'), reason, ttl seconds.
-- Python half: services/export/otlp/processor.py (_CLOSE_LUA).

redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[4]))
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
