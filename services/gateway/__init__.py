"""The ingest gateway: authenticated HTTP in front of the raw shards (docs/gateway.md)."""
