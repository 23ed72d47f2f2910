"""`goose-ingest tail`: follow the topics and print events for a human."""
