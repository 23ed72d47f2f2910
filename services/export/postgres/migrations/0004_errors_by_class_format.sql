-- Error events by class, format, agent and host, per 1,000 runs of that (format, agent, host) cell:
-- the on-call questions "one provider or the whole fleet?" and "one host or everywhere?"
-- (docs/operations.md). A second view, not a rebuilt errors_by_class: its rows and columns stay as
-- they were for whoever reads them. The cells partition the runs, so summing `runs` over the rows of
-- one class and any grouping counts each run once. Events published before contract 1.1 carry no
-- class and count as `other`; a label the run's records do not carry (or a run the runs table does
-- not know yet) counts as '(none)'.
CREATE VIEW errors_by_class_format AS
WITH runs_per_cell AS (
    SELECT coalesce(format, '(none)') AS format,
           coalesce(agent, '(none)')  AS agent,
           coalesce(host, '(none)')   AS host,
           count(*)                   AS runs
      FROM runs
     GROUP BY 1, 2, 3
), errors AS (
    SELECT coalesce(e.data ->> 'errorClass', 'other')                   AS error_class,
           coalesce(r.format, '(none)')                                 AS format,
           coalesce(r.agent, '(none)')                                  AS agent,
           coalesce(r.host, '(none)')                                   AS host,
           count(*)                                                     AS error_events,
           count(DISTINCT e.run_key)                                    AS runs_with_errors
      FROM events e
      LEFT JOIN runs r ON r.run_key = e.run_key
     WHERE e.type = 'error'
     GROUP BY 1, 2, 3, 4
)
SELECT x.error_class,
       x.format,
       x.agent,
       x.host,
       coalesce(c.runs, 0)                                              AS runs,
       x.error_events,
       x.runs_with_errors,
       round(1000.0 * x.error_events / nullif(c.runs, 0), 1)            AS errors_per_1000_runs
  FROM errors x
  LEFT JOIN runs_per_cell c USING (format, agent, host);
