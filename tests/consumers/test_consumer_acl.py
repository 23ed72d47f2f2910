"""What the `consumer` ACL user (dashboards, ad-hoc readers, `tail`) can still do to consumer groups,
and what an exporter's user can do to another's group (issue 20 item 7; docs/consumers.md "What the
consumer user can do to groups"). Real redis-server, deploy/redis/users.acl rendered for the test's
namespace, real groups with pending entries; every attempt checked against the groups' state."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from services.export.postgres.sink import DEFAULT_GROUP as POSTGRES_GROUP
from tests.consumers.harness import World, world

pytestmark = pytest.mark.e2e

# Every command that reads through, moves or drops a group, or the entries a group still needs.
GROUP_MOVES = [
    ("XGROUP", "CREATE", "{s}", "analytics", "0"),
    ("XGROUP", "CREATECONSUMER", "{s}", "{g}", "intruder"),
    ("XGROUP", "DELCONSUMER", "{s}", "{g}", "exporter-1"),
    ("XGROUP", "SETID", "{s}", "{g}", "$"),
    ("XGROUP", "DESTROY", "{s}", "{g}"),
    ("XREADGROUP", "GROUP", "{g}", "intruder", "COUNT", "10", "STREAMS", "{s}", ">"),
    ("XACK", "{s}", "{g}", "{id}"),
    ("XCLAIM", "{s}", "{g}", "intruder", "0", "{id}"),
    ("XAUTOCLAIM", "{s}", "{g}", "intruder", "0", "0-0"),
    ("XPENDING", "{s}", "{g}"),
    ("XSETID", "{s}", "{id}"),
    ("XDEL", "{s}", "{id}"),
    ("XTRIM", "{s}", "MAXLEN", "0"),
]


def _group_state(w: World, stream: str, group: str) -> dict:
    g = next(x for x in w.root().xinfo_groups(stream) if x["name"].decode() == group)
    return {k: g[k] for k in ("consumers", "pending", "last-delivered-id")}


def _setup(w: World) -> tuple[str, str, bytes]:
    """A topic partition with entries, the sink's group on it, one entry pending for `exporter-1`."""
    root = w.root()
    stream = w.settings.layout.events_partition(0)
    ids = [root.xadd(stream, {"eventId": f"r:{i}", "runId": "r", "seq": str(i), "type": "agent", "data": "{}"})
           for i in range(3)]
    root.xgroup_create(stream, POSTGRES_GROUP, id="0")
    root.xreadgroup(POSTGRES_GROUP, "exporter-1", {stream: ">"}, count=1)
    return stream, POSTGRES_GROUP, ids[0]


@pytest.fixture
def acl_world(tmp_path: Path):
    with world(tmp_path / "acl") as w:
        yield w


def _client(w: World, role: str) -> redis.Redis:
    s = w.as_role(role)
    assert s.redis_username and s.redis_password
    return redis.Redis(port=w.server.port, username=s.redis_username, password=s.redis_password.get_secret_value(),
                       socket_timeout=10)


def test_the_consumer_user_sees_groups_but_cannot_move_them(acl_world: World):
    w = acl_world
    stream, group, first = _setup(w)
    before = _group_state(w, stream, group)
    consumer = _client(w, "consumer")
    allowed = []
    for template in GROUP_MOVES:
        command = [part.format(s=stream, g=group, id=first.decode()) for part in template]
        try:
            consumer.execute_command(*command)
        except redis.exceptions.NoPermissionError:
            continue
        allowed.append(command)
    assert allowed == [], f"the consumer user moved a group: {allowed}"
    assert _group_state(w, stream, group) == before
    assert w.root().xlen(stream) == 3
    # What it can still do: read the topic by id, and see the groups' metadata (names, consumers,
    # pending counts, lag; XINFO STREAM FULL also lists the pending entries' ids, consumer names and
    # delivery counts). Nothing of an entry's content beyond the topic it may read anyway.
    assert len(consumer.xrange(stream)) == 3
    groups = consumer.xinfo_groups(stream)
    assert [(g["name"].decode(), g["pending"]) for g in groups] == [(group, 1)]
    assert [c["name"].decode() for c in consumer.xinfo_consumers(stream, group)] == ["exporter-1"]
    full = consumer.xinfo_stream(stream, full=True)
    assert full["groups"][0]["pending"][0][1] == b"exporter-1"  # pending entry, its consumer


def test_an_exporter_user_can_read_through_another_exporters_group_on_its_topics(acl_world: World):
    """The limit docs/consumers.md states: Redis ACLs cannot name groups, so `goose-otlp-exporter`
    may read and acknowledge through the PostgreSQL sink's group on the topics (not destroy or
    rewind it, not write the sink's dead letters or state)."""
    w = acl_world
    stream, group, first = _setup(w)
    otlp = _client(w, "otlp-exporter")
    got = otlp.xreadgroup(group, "otlp-as-intruder", {stream: ">"}, count=1)
    assert got and len(got[0][1]) == 1
    assert otlp.xack(stream, group, first) == 1
    for template in (("XGROUP", "DESTROY", "{s}", "{g}"), ("XGROUP", "SETID", "{s}", "{g}", "$"), ("XDEL", "{s}", "{id}")):
        with pytest.raises(redis.exceptions.NoPermissionError):
            otlp.execute_command(*[part.format(s=stream, g=group, id=first.decode()) for part in template])
    with pytest.raises(redis.exceptions.NoPermissionError):
        otlp.xadd(w.settings.layout.export_deadletter_partition("postgres", 0), {"reason": "forged"})
