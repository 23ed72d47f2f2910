-- Every event that carries an error class, one row each, with its run's labels: `error` events
-- (before contract 1.1 they carry no class and count as `other`) and the warnings that announce a
-- retry of a cause (Claude Code api_retry, Codex retry notices). It is what the error-class alerts
-- count (docs/operations.md, "Pages counted in runs and hosts"); the runbooks group it by run and
-- by host over the alert's window (`WHERE ts > now() - interval '15 minutes'`: the filter reaches
-- the partitioned `events` table through this view). A run the runs table does not know yet has
-- no host, format or agent here (NULL).
CREATE VIEW class_failures AS
SELECT e.ts,
       coalesce(e.data ->> 'errorClass', 'other') AS error_class,
       e.type,
       e.run_key,
       r.host,
       r.format,
       r.agent,
       e.code,
       e.data ->> 'message'                       AS message
  FROM events e
  LEFT JOIN runs r ON r.run_key = e.run_key
 WHERE e.type = 'error' OR (e.type = 'warning' AND e.data ? 'errorClass');
