"""The tap: runs goose (or reads a file) and publishes every output line as a raw entry (docs/raw-entries.md)."""
