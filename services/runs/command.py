"""`goose-ingest runs`: the runs the workers have open, from what they already keep.

The source is the workers' active-runs index (a sorted set per shard, run -> its last activity in
Redis ms, written by every commit; contracts/keys.py) and each run's stored state (host, agent,
format, entries and events so far). A run's start is its `started` record on the runs topic: the
topic is read backwards from its end, at most MAX_SCANNED_RECORDS records, so a run started long ago
in a busy fleet may show its age as `?`.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import orjson

from contracts.stream_ids import StreamId
from contracts.topics import RECORD, TopicEntry
from services.settings import ConfigError, Settings

if TYPE_CHECKING:
    from services.redaction import Redactor

DEFAULT_LIMIT = 50
MAX_SCANNED_RECORDS = 20_000
SCAN_CHUNK = 1000


@dataclass
class ActiveRun:
    run: str
    last_ms: int
    host: str = "?"
    agent: str = "?"
    format: str = "?"
    entries: int = 0
    events: int = 0
    started_ms: int | None = None


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "runs",
        help="list the runs the workers have open: host, format, age, last activity",
        description="List the open runs (started, not yet ended or abandoned), most recently active first: run key, "
        "host, agent, format, entries and events so far, age since the run started and time since its last "
        "entry. Reads the workers' active-runs index and run states; needs a broker and the admin or worker role.",
    )
    p.add_argument("--limit", type=int, default=DEFAULT_LIMIT, help=f"at most this many runs (default {DEFAULT_LIMIT})")
    p.add_argument("--json", action="store_true", help="one JSON object per run instead of a table")
    p.set_defaults(func=run)


def count_active(client: Any, settings: Settings) -> int:
    """Open runs in the index (one ZCARD per set); the worker's gauge and the summary line use it."""
    return sum(int(client.zcard(key)) for key in settings.layout.active_run_sets())


def active_runs(client: Any, settings: Settings, limit: int) -> list[ActiveRun]:
    """The `limit` most recently active open runs with what their states say. A state keeps the host
    and agent labels as the tap wrote them (replay must see the same input); they are shown redacted
    by the configured redactor, as the run's records publish them (RunSequencer._envelope_text)."""
    redactor = settings.redactor()
    layout = settings.layout
    found: list[ActiveRun] = []
    for key in layout.active_run_sets():
        # ZRANGE ... REV, not ZREVRANGE: the worker role's ACL (deploy/redis/users.acl) allows only ZRANGE
        reply = client.execute_command("ZRANGE", key, 0, max(0, limit - 1), "REV", "WITHSCORES")
        for member, score in _pairs(reply):
            found.append(ActiveRun(member.decode(), int(float(score))))
    found.sort(key=lambda r: -r.last_ms)
    found = found[:limit]
    pipe = client.pipeline(transaction=False)
    for r in found:
        pipe.hget(layout.run_state(r.run), "s")
    for r, blob in zip(found, pipe.execute(raise_on_error=False), strict=True):
        if not isinstance(blob, bytes):
            continue  # gone meanwhile (ended and expired), or not a state
        try:
            state = orjson.loads(blob)
        except orjson.JSONDecodeError:
            continue
        norm = state.get("norm") or {}
        r.host = _shown(redactor, state.get("host"), "?")
        r.agent = _shown(redactor, state.get("agent"), "-")
        r.format = str(norm.get("format") or "?")
        r.entries = int(state.get("next") or 0)
        r.events = int(norm.get("n") or 0)
    _find_starts(client, settings, found)
    return found


def _shown(redactor: Redactor | None, label: Any, absent: str) -> str:
    """A label of a run's envelope as the run's records publish it: redacted (when redaction is on)."""
    if not label:
        return absent
    text = str(label)
    return text if redactor is None else redactor.redact_text(text)[0]


def _pairs(reply: Any) -> list[tuple[bytes, Any]]:
    """(member, score) pairs of a WITHSCORES reply: flat in RESP2, nested pairs in RESP3."""
    items = list(reply or [])
    if items and isinstance(items[0], list | tuple):
        return [(bytes(m), sc) for m, sc in items]
    return [(bytes(items[i]), items[i + 1]) for i in range(0, len(items) - 1, 2)]


def _find_starts(client: Any, settings: Settings, runs: list[ActiveRun]) -> None:
    """Each run's `started` record time, reading the runs topic backwards (bounded)."""
    wanted = {r.run: r for r in runs}
    for stream in settings.layout.runs_partitions():
        last, scanned = "+", 0
        while wanted and scanned < MAX_SCANNED_RECORDS:
            chunk = client.xrevrange(stream, max=last, min="-", count=SCAN_CHUNK)
            if not chunk:
                break
            scanned += len(chunk)
            for sid, fields in chunk:
                entry = TopicEntry.from_fields(fields, RECORD)
                r = wanted.get(entry.run or "")
                if r is not None and entry.label == "started":
                    r.started_ms = _record_ms(fields) or StreamId.parse(sid).ms
                    del wanted[r.run]
            last = "(" + chunk[-1][0].decode()


def _record_ms(fields: dict[bytes, bytes]) -> int | None:
    """The record's own time (its first entry's), not when the worker committed it."""
    try:
        ts = TopicEntry.from_fields(fields, RECORD).document().get("timestamp")
        return int(datetime.fromisoformat(str(ts).replace("Z", "+00:00")).timestamp() * 1000)
    except (ValueError, TypeError):  # TopicEntryError is a ValueError
        return None


def _ago(ms: int | None, now_ms: int) -> str:
    if ms is None:
        return "?"
    s = max(0, (now_ms - ms) // 1000)
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def run(args: argparse.Namespace) -> int:
    from services.broker.connect import sync_client

    settings = Settings()
    if not settings.redis_url:
        raise ConfigError("no broker configured (GOOSE_INGEST_REDIS_URL); `goose-ingest up` starts one")
    if args.limit < 1:
        raise ConfigError("--limit must be >= 1")
    client = sync_client(settings)
    try:
        total = count_active(client, settings)
        runs = active_runs(client, settings, args.limit)
        now_ms = int(client.time()[0]) * 1000  # the broker's clock: the index's scores are its ms
    finally:
        client.close()
    if args.json:
        for r in runs:
            print(orjson.dumps({"runId": r.run, "host": r.host, "agent": r.agent, "format": r.format,
                                "entries": r.entries, "events": r.events, "startedMs": r.started_ms,
                                "lastActivityMs": r.last_ms}).decode())
        return 0
    if runs:
        print(f"{'RUN':<40} {'HOST':<16} {'FORMAT':<11} {'AGENT':<11} {'ENTRIES':>7} {'EVENTS':>6} {'AGE':>7} "
              f"{'LAST':>7}  LAST ACTIVITY")
    for r in runs:
        last = datetime.fromtimestamp(r.last_ms / 1000).strftime("%Y-%m-%d %H:%M:%S")
        print(f"{r.run:<40} {r.host[:16]:<16} {r.format:<11} {r.agent[:11]:<11} {r.entries:>7} {r.events:>6} "
              f"{_ago(r.started_ms, now_ms):>7} {_ago(r.last_ms, now_ms):>7}  {last}")
    more = f" (showing the {len(runs)} most recently active; --limit)" if total > len(runs) else ""
    print(f"goose-ingest runs: {total} open run{'s' if total != 1 else ''}{more}", file=sys.stderr)
    return 0
