"""Everything that knows about Redis: connections, key names, shard routing."""
