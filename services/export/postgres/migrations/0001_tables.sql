-- v1: the tables of the PostgreSQL sink. Unqualified names: they go to the first schema of the
-- connection's search_path (one deployment per schema is possible).

-- One row per harness event. Natively partitioned by month on `ts` (the sink creates partitions
-- ahead; retention drops whole partitions). A partitioned table's unique keys must contain the
-- partition key, so the key is (run_key, seq, ts): the contract makes eventId = `<runId>:<seq>`
-- (the sink dead-letters an event where it is not), and an event's timestamp is part of its
-- content, so a re-delivered event has the same triple. One index serves both idempotency and
-- "the events of this run, in order".
-- The sink sends only `ts` and the event (`data`, verbatim); the typed columns are generated from
-- it by the server (less work in the sink's process, and one definition of each column). A value
-- that does not fit its column (an exit code beyond integer, a seq that is not a number) makes the
-- server refuse the row, which the sink then dead-letters with the server's reason.
CREATE TABLE events (
    ts           timestamptz NOT NULL,
    data         jsonb       NOT NULL,
    event_id     text        NOT NULL GENERATED ALWAYS AS (data ->> 'eventId') STORED,
    run_key      text        NOT NULL GENERATED ALWAYS AS (data ->> 'runId') STORED,
    seq          integer     NOT NULL GENERATED ALWAYS AS ((data ->> 'seq')::integer) STORED,
    type         text        NOT NULL GENERATED ALWAYS AS (data ->> 'type') STORED,
    tool         text        GENERATED ALWAYS AS (data ->> 'tool') STORED,
    tool_call_id text        GENERATED ALWAYS AS (data ->> 'toolCallId') STORED,
    success      boolean     GENERATED ALWAYS AS (
        CASE jsonb_typeof(data -> 'isSuccess') WHEN 'boolean' THEN (data -> 'isSuccess')::boolean END) STORED,
    exit_code    integer     GENERATED ALWAYS AS (
        CASE jsonb_typeof(data -> 'exitCode') WHEN 'number' THEN (data ->> 'exitCode')::integer END) STORED,
    path         text        GENERATED ALWAYS AS (data ->> 'path') STORED,
    command      text        GENERATED ALWAYS AS (data ->> 'command') STORED,
    duration_ms  bigint      GENERATED ALWAYS AS (
        CASE jsonb_typeof(data -> 'durationMs') WHEN 'number' THEN (data ->> 'durationMs')::bigint END) STORED,
    code         text        GENERATED ALWAYS AS (data ->> 'code') STORED,
    PRIMARY KEY (run_key, seq, ts)
) PARTITION BY RANGE (ts);

-- Every lifecycle record as received (key: recordId). The `runs` row is recomputed from these,
-- so it does not depend on the order or number of deliveries.
CREATE TABLE run_records (
    record_id          text        PRIMARY KEY,
    run_key            text        NOT NULL,
    k                  integer     NOT NULL,
    state              text        NOT NULL,
    ts                 timestamptz NOT NULL,
    seq                integer     NOT NULL,
    host               text,
    agent              text,
    parent_run_key     text,
    continues_run_key  text,
    exit_code          integer,
    input_tokens       bigint,
    output_tokens      bigint,
    total_tokens       bigint,
    cache_read_tokens  bigint,
    cache_write_tokens bigint,
    cost_usd           double precision,
    counts             jsonb       NOT NULL,
    data               jsonb       NOT NULL
);
CREATE INDEX run_records_run ON run_records (run_key, k);

CREATE TABLE runs (
    run_key            text        PRIMARY KEY,
    host               text,
    agent              text,
    parent_run_key     text,
    continues_run_key  text,
    state              text        NOT NULL,
    last_k             integer     NOT NULL,
    records            integer     NOT NULL,
    started_at         timestamptz,
    ended_at           timestamptz,
    exit_code          integer,
    input_tokens       bigint,
    output_tokens      bigint,
    total_tokens       bigint,
    cache_read_tokens  bigint,
    cache_write_tokens bigint,
    cost_usd           double precision,
    event_counts       jsonb       NOT NULL,
    events_total       integer     NOT NULL,
    missing            jsonb,
    updated_at         timestamptz NOT NULL DEFAULT now()
);

-- The consumer's position per topic partition, written in the same transaction as the rows:
-- the highest stream entry id whose content is committed here (ms and sequence parts, so they
-- compare as numbers).
CREATE TABLE consumer_positions (
    stream      text        PRIMARY KEY,
    last_ms     bigint      NOT NULL,
    last_seq    bigint      NOT NULL,
    entries     bigint      NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- The runs row as a function of the run's records: state, exit code and usage of the record with
-- the highest k (the latest transition), labels from the latest record that has them, start from
-- the `started` record, end from the terminal one. Any delivery order gives the same row.
CREATE FUNCTION refresh_runs(keys text[]) RETURNS void LANGUAGE sql AS $$
    INSERT INTO runs AS r (
        run_key, host, agent, parent_run_key, continues_run_key, state, last_k, records,
        started_at, ended_at, exit_code, input_tokens, output_tokens, total_tokens,
        cache_read_tokens, cache_write_tokens, cost_usd, event_counts, events_total, missing, updated_at)
    SELECT
        rr.run_key,
        (array_agg(rr.host ORDER BY rr.k DESC) FILTER (WHERE rr.host IS NOT NULL))[1],
        (array_agg(rr.agent ORDER BY rr.k DESC) FILTER (WHERE rr.agent IS NOT NULL))[1],
        (array_agg(rr.parent_run_key ORDER BY rr.k DESC) FILTER (WHERE rr.parent_run_key IS NOT NULL))[1],
        (array_agg(rr.continues_run_key ORDER BY rr.k DESC) FILTER (WHERE rr.continues_run_key IS NOT NULL))[1],
        (array_agg(rr.state ORDER BY rr.k DESC))[1],
        max(rr.k),
        count(*),
        coalesce(min(rr.ts) FILTER (WHERE rr.state = 'started'), min(rr.ts)),
        max(rr.ts) FILTER (WHERE rr.state IN ('ended', 'abandoned')),
        (array_agg(rr.exit_code ORDER BY rr.k DESC) FILTER (WHERE rr.state = 'ended'))[1],
        (array_agg(rr.input_tokens ORDER BY rr.k DESC) FILTER (WHERE rr.input_tokens IS NOT NULL))[1],
        (array_agg(rr.output_tokens ORDER BY rr.k DESC) FILTER (WHERE rr.output_tokens IS NOT NULL))[1],
        (array_agg(rr.total_tokens ORDER BY rr.k DESC) FILTER (WHERE rr.total_tokens IS NOT NULL))[1],
        (array_agg(rr.cache_read_tokens ORDER BY rr.k DESC) FILTER (WHERE rr.cache_read_tokens IS NOT NULL))[1],
        (array_agg(rr.cache_write_tokens ORDER BY rr.k DESC) FILTER (WHERE rr.cache_write_tokens IS NOT NULL))[1],
        (array_agg(rr.cost_usd ORDER BY rr.k DESC) FILTER (WHERE rr.cost_usd IS NOT NULL))[1],
        (array_agg(rr.counts ORDER BY rr.k DESC))[1],
        (SELECT coalesce(sum(v::bigint), 0)::integer
           FROM jsonb_each_text((array_agg(rr.counts ORDER BY rr.k DESC))[1]) AS c(t, v)),
        (array_agg(rr.data -> 'missing' ORDER BY rr.k DESC) FILTER (WHERE rr.data ? 'missing'))[1],
        now()
    FROM run_records rr
    WHERE rr.run_key = ANY(keys)
    GROUP BY rr.run_key
    ON CONFLICT (run_key) DO UPDATE SET
        host = EXCLUDED.host, agent = EXCLUDED.agent, parent_run_key = EXCLUDED.parent_run_key,
        continues_run_key = EXCLUDED.continues_run_key, state = EXCLUDED.state, last_k = EXCLUDED.last_k,
        records = EXCLUDED.records, started_at = EXCLUDED.started_at, ended_at = EXCLUDED.ended_at,
        exit_code = EXCLUDED.exit_code, input_tokens = EXCLUDED.input_tokens,
        output_tokens = EXCLUDED.output_tokens, total_tokens = EXCLUDED.total_tokens,
        cache_read_tokens = EXCLUDED.cache_read_tokens, cache_write_tokens = EXCLUDED.cache_write_tokens,
        cost_usd = EXCLUDED.cost_usd, event_counts = EXCLUDED.event_counts,
        events_total = EXCLUDED.events_total, missing = EXCLUDED.missing, updated_at = EXCLUDED.updated_at;
$$;
