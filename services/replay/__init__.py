"""`goose-ingest replay`: rebuild events from the raw log and compare with what was published."""
