"""`export otlp` on a redelivered batch (issue 20, found by the consumer contract): the tool spans of
events already noted seen, and every tool span of a run whose root went out complete, are not sent
again. In process against a real Redis and a real OTLP/HTTP receiver, the batch handed to the
exporter a second time as a re-read after a crash (or a group recreated at 0) hands it."""

from __future__ import annotations

import asyncio
from collections import Counter

from tests.export.test_export_otlp import (  # the exporter's own test helpers: one way to build its input
    make_exporter,
    metric,
    publish_events,
    publish_records,
    r,  # noqa: F401 (fixture)
    receiver,  # noqa: F401 (fixture)
    run_events,
    run_records,
)

RUN = "contract/redelivered"


def _redeliver(exporter, settings, r):  # noqa: F811 (fixture name)
    async def again() -> None:
        for stream in exporter.streams():
            entries = r.xrange(stream)
            if entries:
                await exporter.handler_for(stream)(stream, [e for e, _ in entries], [f for _, f in entries])
    return again()


def _tool_spans(receiver) -> Counter:  # noqa: F811
    return Counter(s.span_id for s in receiver.spans if not s.name.startswith("invoke_agent"))


def test_a_redelivered_batch_of_an_open_run_sends_no_tool_span_twice(settings, r, receiver):  # noqa: F811
    async def go():
        exporter = make_exporter(settings, receiver.endpoint)
        await exporter.ensure_groups()
        publish_events(r, settings, run_events(RUN))  # no end record: the run stays open
        await _redeliver(exporter, settings, r)
        first = _tool_spans(receiver)
        await _redeliver(exporter, settings, r)
        await exporter.client.aclose()
        return first

    first = asyncio.run(go())
    assert len(first) == 2
    assert _tool_spans(receiver) == first  # each once


def test_a_redelivered_batch_of_a_completed_run_sends_nothing_and_counts_nothing_late(settings, r, receiver):  # noqa: F811
    async def go():
        exporter = make_exporter(settings, receiver.endpoint)
        await exporter.ensure_groups()
        publish_events(r, settings, run_events(RUN))
        publish_records(r, settings, run_records(RUN))
        await _redeliver(exporter, settings, r)
        sent = len(receiver.spans)
        await _redeliver(exporter, settings, r)
        await exporter.client.aclose()
        return exporter, sent

    exporter, sent = asyncio.run(go())
    assert sent == 3 and len(receiver.spans) == 3, [s.name for s in receiver.spans]
    assert max(_tool_spans(receiver).values()) == 1
    assert metric(exporter, "goose_ingest_otlp_late_events_total") == 0
