-- Error events by class (`errorClass`, docs/contract.md "Error classes") and agent, per 1,000 runs
-- of that agent. Events published before contract 1.1 carry no class and count as `other`; events
-- of runs the runs table does not know (yet) count under agent '(none)'.
CREATE VIEW errors_by_class AS
WITH runs_per_agent AS (
    SELECT coalesce(agent, '(none)') AS agent, count(*) AS runs
      FROM runs
     GROUP BY 1
), errors AS (
    SELECT coalesce(e.data ->> 'errorClass', 'other')                   AS error_class,
           coalesce(r.agent, '(none)')                                  AS agent,
           count(*)                                                     AS error_events,
           count(DISTINCT e.run_key)                                    AS runs_with_errors
      FROM events e
      LEFT JOIN runs r ON r.run_key = e.run_key
     WHERE e.type = 'error'
     GROUP BY 1, 2
)
SELECT x.error_class,
       x.agent,
       coalesce(a.runs, 0)                                              AS runs,
       x.error_events,
       x.runs_with_errors,
       round(1000.0 * x.error_events / nullif(a.runs, 0), 1)            AS errors_per_1000_runs
  FROM errors x
  LEFT JOIN runs_per_agent a USING (agent);
