"""`goose-ingest export jsonl`: the topics as JSON-lines files (docs/consumers.md "Adding a sink")."""
