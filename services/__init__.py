"""goose-ingest services: normalizer (pure core) and the shells around it."""
