"""The one module that names keys: single-node names unchanged, cluster names one slot per shard."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from contracts.events import EVENT_TYPES
from contracts.keys import KeyLayout
from services.settings import CLUSTER_SHARDS, SINGLE_NODE_SHARDS, Settings

RUN = st.from_regex(r"[A-Za-z0-9._:/@-]{1,60}", fullmatch=True)


def _tag(key: str) -> str:
    """The part of a key Redis Cluster hashes: the first non-empty {...}, else the whole key."""
    m = re.search(r"\{([^}]+)\}", key)
    return m.group(1) if m else key


def test_single_node_keeps_the_historic_names():
    k = KeyLayout(shards=4)
    assert k.raw_stream(3) == "goose.raw.3"
    assert k.control_stream(3) == "goose.control.3"
    assert k.events_partitions() == ["harness.events"]
    assert k.type_partitions("error") == ["harness.events.error"]
    assert k.runs_partitions() == ["harness.runs"] and k.deadletter_partitions() == ["goose.deadletter"]
    assert k.run_state("h/1") == "goose-ingest:run:h/1" and k.active_runs(2) == "goose-ingest:active"
    assert KeyLayout(namespace="t1").raw_stream(0) == "t1:goose.raw.0"
    assert k.shard_lease(3) == "goose-ingest:lease:3" and k.workers() == "goose-ingest:workers"


@given(RUN, st.text(min_size=1, max_size=20))
def test_in_a_cluster_everything_of_a_run_shares_its_shards_slot(run, group):
    k = KeyLayout(shards=16, cluster=True, namespace="ns")
    shard = k.shard_of(run)
    keys = [
        k.raw_stream(shard), k.control_stream(shard), k.run_state(run), k.active_runs(shard),
        k.import_checkpoint(run), k.export_state("otlp", run), k.events_partition(shard),
        k.export_group_state("otlp", group, run), k.export_group_open_runs("otlp", group, shard),
        k.runs_partition(shard), k.deadletter_partition(shard), k.shard_lease(shard),
        *(k.type_partition(t, shard) for t in EVENT_TYPES),
    ]
    assert {_tag(key) for key in keys} == {f"s{shard}"}
    assert all(key.startswith("ns:") for key in keys)


def test_cluster_topics_have_one_partition_per_shard_and_distinct_tags():
    k = KeyLayout(shards=16, cluster=True)
    parts = k.events_partitions()
    assert len(parts) == 16 and len({_tag(p) for p in parts}) == 16


def test_shard_default_follows_the_mode_and_a_copy_gets_its_own_names():
    assert Settings().shards == SINGLE_NODE_SHARDS
    assert Settings(redis_cluster=True).shards == CLUSTER_SHARDS
    assert Settings(redis_cluster=True, shards=5).shards == 5
    a = Settings(namespace="a")
    assert a.layout.raw_stream(0) == "a:goose.raw.0"
    assert a.model_copy(update={"namespace": "b"}).layout.raw_stream(0) == "b:goose.raw.0"


@given(st.text(min_size=1, max_size=12), st.text(min_size=1, max_size=12), st.text(min_size=1, max_size=12),
       st.text(min_size=1, max_size=12))
def test_each_group_has_its_own_export_state_and_names_never_collide(g1, r1, g2, r2):
    # Group names are free text (`:` and braces included): (group, run) -> key is one-to-one.
    k = KeyLayout()
    assert (k.export_group_state("otlp", g1, r1) == k.export_group_state("otlp", g2, r2)) == ((g1, r1) == (g2, r2))
    assert (k.export_group_open_runs("otlp", g1, 0) == k.export_group_open_runs("otlp", g2, 0)) == (g1 == g2)
    assert k.export_group_state("otlp", g1, r1) != k.export_state("otlp", r1)


def test_group_state_names():
    k = KeyLayout()
    assert k.export_group_state("otlp", "a:{b}%", "h/1") == "goose-ingest:export-group:otlp:a%3A%7Bb%7D%25:h/1"
    assert k.export_group_open_runs("otlp", "g", 2) == "goose-ingest:export-group-open:otlp:g"
    c = KeyLayout(cluster=True, shards=4)
    assert c.export_group_open_runs("otlp", "g", 2) == "goose-ingest:export-group-open:otlp:g:{s2}"
