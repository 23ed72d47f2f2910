"""Backlog and lag of a consumer group, with ONE rule for "unknown".

Redis 7 reports a group's `lag` (entries added to the stream after the group's last-delivered id)
from counters; it answers nil when it cannot (an entry deleted inside the group's window by XDEL,
a group created or moved with XGROUP SETID at an arbitrary id; measured on Redis 7.0: a trim by
XTRIM MINID keeps a number, which still counts the deleted entries). Before, the worker exported
NaN, `export otlp` counted 1 and `export postgres` counted 0 - so an unknown backlog could read 0
and no alert saw it. The one rule now: an unknown lag is COUNTED, the entries still in the stream
after the group's last-delivered id (XRANGE, at most LAG_COUNT_CAP of them: past that the gauge
reads the cap, still far above every alert threshold). What a capped trim deleted unread is not lag
any more (nobody can read it): goose_ingest_topic_trimmed_unread_total{group} counts it, and its
alert fires (services/worker/housekeeping.py `trim_topic`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from redis.exceptions import ResponseError

LAG_COUNT_CAP = 10_000


class GroupBacklog(NamedTuple):
    """A group's position on one stream. `lag` None: Redis did not know it (see the module doc);
    `counted_lag` then fills it in. `missing`: the group (or the stream) does not exist."""

    lag: int | None
    pending: int
    last_delivered: str
    missing: bool = False


MISSING = GroupBacklog(0, 0, "0-0", missing=True)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def group_backlog(groups: Iterable[Mapping[Any, Any]] | None, group: str) -> GroupBacklog:
    """The named group's backlog from an XINFO GROUPS reply (MISSING when it is not there)."""
    for info in groups or []:
        if _text(info.get("name", b"")) == group:
            lag = info.get("lag")
            return GroupBacklog(None if lag is None else int(lag), int(info.get("pending") or 0),
                                _text(info.get("last-delivered-id") or "0-0"))
    return MISSING


def after(entry_id: str) -> str:
    """The exclusive XRANGE start just after `entry_id`."""
    return "(" + entry_id


def counted_lag(backlog: GroupBacklog, entries_after: int) -> int:
    """The lag to report: Redis's when known, else the entries counted after the group's position."""
    return backlog.lag if backlog.lag is not None else entries_after


async def read_backlog(client: Any, stream: str, group: str) -> GroupBacklog:
    """The group's backlog on `stream`, its lag always known (async client)."""
    try:
        backlog = group_backlog(await client.xinfo_groups(stream), group)
    except ResponseError:  # no such stream
        return MISSING
    if backlog.lag is None and not backlog.missing:
        rows = await client.xrange(stream, min=after(backlog.last_delivered), max="+", count=LAG_COUNT_CAP)
        backlog = backlog._replace(lag=counted_lag(backlog, len(rows or [])))
    return backlog


def read_backlog_sync(client: Any, stream: str, group: str) -> GroupBacklog:
    """`read_backlog` for a synchronous client."""
    try:
        backlog = group_backlog(client.xinfo_groups(stream), group)
    except ResponseError:
        return MISSING
    if backlog.lag is None and not backlog.missing:
        rows = client.xrange(stream, min=after(backlog.last_delivered), max="+", count=LAG_COUNT_CAP)
        backlog = backlog._replace(lag=counted_lag(backlog, len(rows or [])))
    return backlog
