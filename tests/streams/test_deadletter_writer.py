"""The one dead-letter writer (services/streams/deadletter.py, deadletter_ack.lua) on a real Redis:
the letter and the acknowledgement of its entry in one step, raw.* kept, the retention by age
applied by the same step, nothing acknowledged when the letter cannot be written."""

from __future__ import annotations

import time

import pytest
import redis
from redis.exceptions import ResponseError

from contracts.deadletters import DeadLetter
from services.settings import Settings
from services.streams.deadletter import DeadLetterWriter, retention_minid, script_args

GROUP = "g"


def test_retention_minid_is_the_age_cut_in_ms_or_nothing() -> None:
    assert retention_minid(10_000.0, 1.0) == "6400000-0"
    assert retention_minid(100.0, 1.0) == "0-0"  # never negative
    assert retention_minid(10_000.0, None) == ""


def test_script_args_follow_the_scripts_layout() -> None:
    letter = DeadLetter("r", "d", "s", "1-0")
    args = script_args(GROUP, "5-0", [letter], {"s": ["1-0", "2-0"]})
    fields = [part for pair in letter.to_fields().items() for part in pair]
    assert args == [GROUP, "5-0", 1, len(fields), *fields, 2, "1-0", "2-0"]


@pytest.fixture
def r(settings: Settings):
    client = redis.Redis.from_url(settings.redis_url or "")
    yield client
    client.close()


def test_a_letter_and_its_acknowledgement_are_one_step_with_raw_fields_and_age_trim(settings: Settings, r) -> None:
    src, dead = f"{settings.namespace}:src", f"{settings.namespace}:dead"
    r.xgroup_create(src, GROUP, id="0", mkstream=True)
    entry = r.xadd(src, {"runId": "h/r", "data": b"{broken"}).decode()
    r.xreadgroup(GROUP, "c", {src: ">"})
    old_ms = int((time.time() - 3 * 3600) * 1000)
    for i in range(250):
        r.xadd(dead, {"reason": "old"}, id=f"{old_ms}-{i}")
    writer = DeadLetterWriter(r, GROUP, retention_hours=1.0)
    fields = dict(r.xrange(src)[0][1])
    writer.write(dead, [DeadLetter("invalid-entry", "broken", src, entry, exporter="x", group=GROUP, raw=fields)],
                 {src: [entry]})
    assert r.xpending(src, GROUP)["pending"] == 0
    left = r.xrange(dead)
    assert len(left) < 250  # the old letters' full nodes went with the write
    letter = DeadLetter.from_fields(left[-1][1])
    assert letter.source_id == entry and dict(letter.raw) == {b"runId": b"h/r", b"data": b"{broken"}


def test_nothing_is_acknowledged_when_the_letter_cannot_be_written(settings: Settings, r) -> None:
    src, dead = f"{settings.namespace}:src", f"{settings.namespace}:dead"
    r.xgroup_create(src, GROUP, id="0", mkstream=True)
    entry = r.xadd(src, {"x": "1"}).decode()
    r.xreadgroup(GROUP, "c", {src: ">"})
    r.set(dead, "not a stream")
    with pytest.raises(ResponseError, match="WRONGTYPE.*nothing acknowledged"):
        DeadLetterWriter(r, GROUP, None).write(dead, [DeadLetter("r", "d", src, entry)], {src: [entry]})
    assert r.xpending(src, GROUP)["pending"] == 1


def test_without_retention_nothing_is_trimmed(settings: Settings, r) -> None:
    dead = f"{settings.namespace}:dead"
    for i in range(250):
        r.xadd(dead, {"reason": "old"}, id=f"1-{i}")
    DeadLetterWriter(r, GROUP, None).write(dead, [DeadLetter("r", "d", "s", "1-0")])
    assert r.xlen(dead) == 251
