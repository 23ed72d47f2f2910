"""The embedded default: a real redis-server started by goose-ingest itself, plus a worker."""
