-- v2: the run's input format and model as columns (records may carry `format` (contract
-- extension for claude-code/codex) and `model`; today's goose records carry neither, so both stay
-- NULL and the views group by agent), backfilled from the stored records, and the analytics views.

ALTER TABLE run_records ADD COLUMN format text, ADD COLUMN model text;
ALTER TABLE runs ADD COLUMN format text, ADD COLUMN model text;

UPDATE run_records SET format = data ->> 'format', model = data ->> 'model'
 WHERE data ? 'format' OR data ? 'model';

CREATE OR REPLACE FUNCTION refresh_runs(keys text[]) RETURNS void LANGUAGE sql AS $$
    INSERT INTO runs AS r (
        run_key, host, agent, format, model, parent_run_key, continues_run_key, state, last_k, records,
        started_at, ended_at, exit_code, input_tokens, output_tokens, total_tokens,
        cache_read_tokens, cache_write_tokens, cost_usd, event_counts, events_total, missing, updated_at)
    SELECT
        rr.run_key,
        (array_agg(rr.host ORDER BY rr.k DESC) FILTER (WHERE rr.host IS NOT NULL))[1],
        (array_agg(rr.agent ORDER BY rr.k DESC) FILTER (WHERE rr.agent IS NOT NULL))[1],
        (array_agg(rr.format ORDER BY rr.k DESC) FILTER (WHERE rr.format IS NOT NULL))[1],
        (array_agg(rr.model ORDER BY rr.k DESC) FILTER (WHERE rr.model IS NOT NULL))[1],
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
        host = EXCLUDED.host, agent = EXCLUDED.agent, format = EXCLUDED.format, model = EXCLUDED.model, parent_run_key = EXCLUDED.parent_run_key,
        continues_run_key = EXCLUDED.continues_run_key, state = EXCLUDED.state, last_k = EXCLUDED.last_k,
        records = EXCLUDED.records, started_at = EXCLUDED.started_at, ended_at = EXCLUDED.ended_at,
        exit_code = EXCLUDED.exit_code, input_tokens = EXCLUDED.input_tokens,
        output_tokens = EXCLUDED.output_tokens, total_tokens = EXCLUDED.total_tokens,
        cache_read_tokens = EXCLUDED.cache_read_tokens, cache_write_tokens = EXCLUDED.cache_write_tokens,
        cost_usd = EXCLUDED.cost_usd, event_counts = EXCLUDED.event_counts,
        events_total = EXCLUDED.events_total, missing = EXCLUDED.missing, updated_at = EXCLUDED.updated_at;
$$;

SELECT refresh_runs(coalesce(array_agg(DISTINCT run_key), '{}')) FROM run_records;

-- Weeks and days are UTC calendar weeks (starting Monday) and days, whatever the session's TimeZone.

-- Tool failure rate by tool and week: failures / calls whose outcome is known.
CREATE VIEW tool_failure_rate_weekly AS
SELECT (date_trunc('week', ts AT TIME ZONE 'UTC'))::date                AS week,
       tool,
       count(*)                                                        AS calls,
       count(*) FILTER (WHERE success IS NOT NULL)                     AS calls_with_outcome,
       count(*) FILTER (WHERE success = false)                         AS failures,
       round(count(*) FILTER (WHERE success = false)::numeric
             / NULLIF(count(*) FILTER (WHERE success IS NOT NULL), 0), 4) AS failure_rate
  FROM events
 WHERE tool IS NOT NULL
 GROUP BY 1, 2;

-- Error and unknown events per 1,000 runs by agent and host (from the runs' event counts, so
-- the answer survives the retention of the events table).
CREATE VIEW error_events_per_1000_runs AS
SELECT coalesce(agent, '(none)')                                        AS agent,
       coalesce(host, '(none)')                                         AS host,
       count(*)                                                         AS runs,
       sum(coalesce((event_counts ->> 'error')::bigint, 0))             AS error_events,
       sum(coalesce((event_counts ->> 'unknown')::bigint, 0))           AS unknown_events,
       round(1000.0 * sum(coalesce((event_counts ->> 'error')::bigint, 0)) / count(*), 1)   AS errors_per_1000_runs,
       round(1000.0 * sum(coalesce((event_counts ->> 'unknown')::bigint, 0)) / count(*), 1) AS unknowns_per_1000_runs
  FROM runs
 GROUP BY 1, 2;

-- Tokens and cost by model and day (the day the run started). `model` is NULL for runs whose
-- records do not name one (all goose runs today): read those rows by agent.
CREATE VIEW usage_by_model_day AS
SELECT (started_at AT TIME ZONE 'UTC')::date                            AS day,
       model,
       agent,
       count(*)                                                         AS runs,
       count(*) FILTER (WHERE total_tokens IS NOT NULL OR cost_usd IS NOT NULL) AS runs_with_usage,
       sum(input_tokens)                                                AS input_tokens,
       sum(output_tokens)                                               AS output_tokens,
       sum(total_tokens)                                                AS total_tokens,
       sum(cache_read_tokens)                                           AS cache_read_tokens,
       sum(cache_write_tokens)                                          AS cache_write_tokens,
       round(sum(cost_usd)::numeric, 6)                                 AS cost_usd  -- no float noise in sums
  FROM runs
 GROUP BY 1, 2, 3;

-- Run duration percentiles (seconds, started -> ended/abandoned) by agent, finished runs only.
CREATE VIEW run_duration_percentiles AS
SELECT coalesce(agent, '(none)')                                        AS agent,
       count(*)                                                         AS runs,
       percentile_cont(0.5)  WITHIN GROUP (ORDER BY extract(epoch FROM ended_at - started_at)) AS p50_s,
       percentile_cont(0.9)  WITHIN GROUP (ORDER BY extract(epoch FROM ended_at - started_at)) AS p90_s,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM ended_at - started_at)) AS p99_s,
       max(extract(epoch FROM ended_at - started_at))                   AS max_s
  FROM runs
 WHERE ended_at IS NOT NULL AND started_at IS NOT NULL
 GROUP BY 1;

-- Runs that were abandoned or exited non-zero.
CREATE VIEW problem_runs AS
SELECT run_key,
       CASE WHEN state = 'abandoned' THEN 'abandoned' ELSE 'non-zero-exit' END AS problem,
       host, agent, state, exit_code, started_at, ended_at,
       extract(epoch FROM ended_at - started_at)                        AS duration_s,
       events_total,
       coalesce((event_counts ->> 'error')::bigint, 0)                  AS error_events,
       missing
  FROM runs
 WHERE state = 'abandoned' OR (state = 'ended' AND exit_code IS NOT NULL AND exit_code <> 0);

-- The slowest commands: per exact command string, how often and how long (durationMs).
CREATE VIEW slowest_commands AS
SELECT command,
       count(*)                                                         AS executions,
       count(DISTINCT run_key)                                          AS runs,
       max(duration_ms)                                                 AS max_ms,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY duration_ms)         AS p50_ms,
       percentile_cont(0.9) WITHIN GROUP (ORDER BY duration_ms)         AS p90_ms,
       count(*) FILTER (WHERE success = false OR exit_code <> 0)        AS failures,
       max(ts)                                                          AS last_seen
  FROM events
 WHERE type = 'command' AND duration_ms IS NOT NULL
 GROUP BY command;
