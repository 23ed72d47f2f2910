"""`up` and `demo`: the whole pipeline on one machine (a worker, and an embedded redis-server when no broker is configured)."""
