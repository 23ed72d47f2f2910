"""PostgreSQL sink of the harness topics: typed tables, monthly partitions, analytics views."""
