"""The consumer skeleton: what every consumer of a goose-ingest stream shares (issue 20, Deliver 1).

A consumer (the worker on the raw shards, `export otlp` and `export postgres` on the topics, and
every later one) keeps only its handler and its target; the jobs below are written once, here:

- `groups`: its consumer group created at id 0 (export what the stream still retains, never `$`),
  waiting through a broker outage instead of crashing; the lost-group guard (NOGROUP -> recreate at
  0 and read again) for FastStream subscribers and for plain loops;
- `pending`: reclaim of entries a dead consumer left pending, with the delivery count that decides
  MAX_DELIVERIES. The count is Redis's `times_delivered`, and it counts only real processing
  attempts because every consumer retries an outage refusal (OOM, LOADING, READONLY, CLUSTERDOWN,
  MOVED/ASK, connection errors: `services.broker.errors.is_outage`) IN PLACE, holding its claim
  fresh, instead of letting the entry go back to the pending list to be claimed again;
- `lag`: backlog and lag with one rule for "unknown" (Redis answers nil after an XDEL in the group's
  window or a group set at an arbitrary id; the skeleton then counts what is left after the group's position, so the lag
  never reads 0 for a backlog it cannot see, and a backlog the trim deleted is 0 plus a count in
  goose_ingest_topic_trimmed_unread_total);
- `readiness`: one `Readiness` (ok + one line of reason) that /readyz shows, answered by every
  consumer from one method, `readiness()`;
- `backoff` (services/backoff.py, a leaf the broker and the tap import too): one `Backoff` (start,
  cap, jitter, reset on success) for every retry loop;
- `deadletter`: the one dead-letter writer (dead letters + acknowledgement in one script,
  `raw.*` kept, trimmed by age: DEADLETTER_RETENTION_HOURS);
- `watch`: one `ReaderWatch`: a reader that died turns readiness false and exits 1;
- `faststream_adapter`: every FastStream internal touched (subscriber read call, start, message),
  with `check_faststream()` for an upgrade;
- `names`: consumer names.
- `reader`: `GroupReader`, the one synchronous group-read loop (own pending entries first, the
  sweep, held entries, poison, acknowledgement with dead letters in one script, in-place retry of a
  refused acknowledgement) of the plain-loop consumers, `export postgres` and `archive`.

Dead letters are a contract (contracts/deadletters.py: one record, one reason vocabulary, one
stream per consumer); topic entries too (contracts/topics.py). docs/consumers.md, "The consumer
skeleton", lists the files a new consumer touches.
"""
