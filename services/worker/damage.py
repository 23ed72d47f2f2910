"""Damage to a raw shard that no component of ours does, seen by the workers (issue 34, item 3).

Redis ACLs cannot restrict XADD's options or ids: a credential that may append (the gateway's, a
direct tap's) can also ``XADD <shard> MAXLEN 0 * ...`` (delete the shard's whole log) or ``XADD
<shard> 18446744073709551615-18446744073709551615 ...`` (after which every ``XADD *`` on the shard
fails). Neither can be prevented; both are detected, per shard and sweep:

- ``deleted-unexpired``: an entry younger than the retention cutoff (``RAW_RETENTION_HOURS``) the
  workers trim to is gone. Their trims never go past that cutoff (nor past what the group
  committed), so it was deleted by something else. Three ways to see it: the newest entry seen at
  the previous sweep is gone while still unexpired (a trim -- MAXLEN, MINID, XTRIM -- deletes a
  prefix, so it takes that one with it; Redis records no id for trims); the stream is empty although
  its last entry is unexpired; or ``max-deleted-entry-id`` (XDEL's) is unexpired.
- ``id-ahead``: the stream's ``last-generated-id`` is more than ``AHEAD_LIMIT_MS`` ahead of Redis's
  clock: ``XADD *`` can only add ids above it, so the shard refuses every tap's entries until the
  clock catches up (for the maximal id: never) -- the stream must be recreated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from redis.exceptions import ResponseError

from contracts.stream_ids import StreamId

DELETED_UNEXPIRED = "deleted-unexpired"
ID_AHEAD = "id-ahead"
REASONS = (DELETED_UNEXPIRED, ID_AHEAD)
AHEAD_LIMIT_MS = 5 * 60_000  # beyond clock skew between Redis nodes (ids come from the primary's clock)


@dataclass(frozen=True)
class Seen:
    """What a sweep saw of a stream: how many entries were ever added, and the newest one's id."""

    added: int
    last: str


def _ms(entry_id: Any) -> int | None:
    return StreamId.ms_of(entry_id)


def judge(info: dict[str, Any], now_ms: int, retention_ms: int, before: Seen | None = None,
          still_there: bool = True) -> list[str]:
    """What is wrong with a raw stream, from its ``XINFO STREAM`` (pure). ``before``: the previous
    sweep's view of the same stream; ``still_there``: whether its newest entry then is still stored."""
    found: list[str] = []
    cutoff = now_ms - retention_ms
    last = _ms(info.get("last-generated-id"))
    added = int(info.get("entries-added") or 0)
    length = int(info.get("length") or 0)
    deleted = _ms(info.get("max-deleted-entry-id"))
    gone_since = (before is not None and added >= before.added and not still_there
                  and (_ms(before.last) or 0) >= cutoff)
    emptied = length == 0 and added > 0 and last is not None and cutoff <= last <= now_ms + AHEAD_LIMIT_MS
    if gone_since or emptied or (deleted is not None and deleted >= max(cutoff, 1)):
        found.append(DELETED_UNEXPIRED)
    if last is not None and last > now_ms + AHEAD_LIMIT_MS:
        found.append(ID_AHEAD)
    return found


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


async def shard_damage(client: Any, streams: list[str], now_ms: int, retention_ms: int,
                       seen: dict[int, Seen]) -> dict[int, list[str]]:
    """Each shard's damage (shards without any are left out; a missing stream has none). ``seen`` is the
    previous sweep's view, updated in place."""
    out: dict[int, list[str]] = {}
    for shard, stream in enumerate(streams):
        try:
            info = {_text(k): v for k, v in (await client.xinfo_stream(stream)).items()}
        except ResponseError:  # no such key: nothing was ever written (or it was recreated): start over
            seen.pop(shard, None)
            continue
        before = seen.get(shard)
        still_there = True
        if before is not None and before.last not in ("", "0-0"):
            still_there = bool(await client.xrange(stream, before.last, before.last, count=1))
        found = judge(info, now_ms, retention_ms, before, still_there)
        if found:
            out[shard] = found
        seen[shard] = Seen(int(info.get("entries-added") or 0), _text(info.get("last-generated-id") or ""))
    return out
