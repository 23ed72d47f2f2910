"""`goose-ingest archive`: the raw log and the event lake on object storage (docs/archive.md)."""
