"""`goose-ingest runs`: the runs the workers have open (the active-runs index)."""
