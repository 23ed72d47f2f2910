"""The deployment facts (shard count, key layout) every writer checks before it writes: pure, no client.

Split out of ``cluster.py`` so that the tap's own connection (``services/tap/conn.py``) runs the
same check as redis-py clients without importing redis-py. ``cluster.ensure_shard_count`` and the
tap both call `check_deployment_facts` with their own client calls.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from contracts.keys import KeyLayout
from services.broker.url import BrokerConfigError

META_SHARDS = "shards"
META_LAYOUT = "layout"


class ShardCountMismatch(BrokerConfigError):
    """The command's shard count (or layout) differs from the one the deployment's data was created with."""


def layout_name(layout: KeyLayout) -> str:
    return "cluster" if layout.cluster else "single"


def judge_meta(layout: KeyLayout, stored: Mapping[bytes, bytes] | Mapping[str, str]) -> None:
    """Pure: raise ShardCountMismatch when the stored deployment facts differ from `layout`."""
    facts = {(k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
             for k, v in stored.items()}
    shards = facts.get(META_SHARDS)
    if shards is not None and shards != str(layout.shards):
        raise ShardCountMismatch(
            f"GOOSE_INGEST_SHARDS={layout.shards} but this deployment's data was created with {shards} shards "
            f"(key {layout.meta()}): set GOOSE_INGEST_SHARDS={shards}"
        )
    kind = facts.get(META_LAYOUT)
    if kind is not None and kind != layout_name(layout):
        raise ShardCountMismatch(
            f"this deployment's data uses the {kind} key layout (key {layout.meta()}) but "
            f"GOOSE_INGEST_REDIS_CLUSTER is {'true' if layout.cluster else 'false'}"
        )


def check_deployment_facts(
    layout: KeyLayout,
    hgetall: Callable[[str], Mapping[bytes, bytes] | Mapping[str, str]],
    hsetnx: Callable[[str, str, str], object],
    refused: type[BaseException] | tuple[type[BaseException], ...],
) -> None:
    """Record the shard count on first use (HSETNX), then refuse a different one.

    `refused` is the client's NOPERM error: tap and import roles only read the facts
    (deploy/redis/users.acl); workers record them."""
    facts = hgetall(layout.meta())
    judge_meta(layout, facts)
    if len(facts) < 2:  # first use: record (HSETNX: whoever comes first wins), then check the winner
        try:
            hsetnx(layout.meta(), META_SHARDS, str(layout.shards))
            hsetnx(layout.meta(), META_LAYOUT, layout_name(layout))
        except refused:
            return
        judge_meta(layout, hgetall(layout.meta()))
