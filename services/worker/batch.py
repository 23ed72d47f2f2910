"""One batch of raw entries -> one atomic commit. The imperative shell around RunSequencer."""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from importlib import resources
from typing import Iterable

import msgpack
import orjson
import redis.asyncio as aioredis

from services.broker.keys import shard_of
from services.normalizer.machine import Limits
from services.sequencer import Entry, EntryError, Outcome, RunSequencer, parse_fields
from services.sequencer.run import DEAD, PROCESSED
from services.settings import Settings

log = logging.getLogger("goose_ingest.worker")

COMMIT_LUA = resources.files("services.worker").joinpath("commit.lua").read_text()
MAX_ATTEMPTS = 8
# Redis bundles an old lua-cmsgpack: no bin or str8 types, so pack bytes and str as raw.
_packb = msgpack.Packer(use_bin_type=False).pack
CACHE_RUNS = 4096  # run sequencers kept in process between batches (LRU)


class CommitConflict(RuntimeError):
    """Another worker kept committing the same runs; the entries stay pending for a retry."""


def state_key(settings: Settings, run: str) -> str:
    return settings.key(f"goose-ingest:run:{run}")


def active_key(settings: Settings) -> str:
    return settings.key("goose-ingest:active")


def sid_ms(sid: str) -> int:
    return int(sid.split("-", 1)[0])


@dataclass
class BatchResult:
    outcomes: dict[str, int] = field(default_factory=dict)  # outcome -> entries
    dead: dict[str, int] = field(default_factory=dict)  # reason -> entries
    events: list[dict] = field(default_factory=list)
    records: list[dict] = field(default_factory=list)
    latencies_ms: list[int] = field(default_factory=list)
    redactions: dict[str, int] = field(default_factory=dict)  # rule -> replacements

    def count(self, outcome: str, reason: str | None = None) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        if reason is not None:
            self.dead[reason] = self.dead.get(reason, 0) + 1


def entry_fields(entry: Entry) -> list:
    """Raw fields of an entry held in run state (its original stream entry is already acked)."""
    out: list = [b"run", entry.run, b"seq", str(entry.seq), b"ts", str(entry.ts), b"kind", entry.kind]
    if entry.kind == "line":
        out += [b"stream", entry.stream, b"line", entry.line]
    if entry.exit is not None:
        out += [b"exit", str(entry.exit)]
    for name, value in ((b"host", entry.host), (b"agent", entry.agent), (b"parent", entry.parent),
                        (b"continues", entry.continues)):
        if value:
            out += [name, value]
    return out


class BatchProcessor:
    def __init__(self, settings: Settings, client: aioredis.Redis) -> None:
        self.settings = settings
        self.client = client
        self.script = client.register_script(COMMIT_LUA)
        self.limits = Limits(settings.max_span_chars, settings.max_pending_tools)
        self.redactor = settings.redactor()
        self.active = active_key(settings)
        self.ttl_ms = str(int(settings.run_state_ttl_hours * 3_600_000))
        self.events_topic = settings.all_events_topic()
        self.runs_topic = settings.runs_stream()
        self.deadletters = settings.deadletters()
        self._topics: dict[str, str] = {}
        self._cache: OrderedDict[str, tuple[str, RunSequencer]] = OrderedDict()

    def topic(self, event_type: str) -> str:
        name = self._topics.get(event_type)
        if name is None:
            name = self._topics[event_type] = self.settings.topic_for(event_type)
        return name

    # ------------------------------------------------------------------ entry
    async def process(
        self,
        stream: str,
        ids: list[bytes] | list[str],
        fields: list[dict[bytes, bytes]],
        deliveries: dict[str, int] | None = None,
        extra_entries: Iterable[Entry] = (),
        extra_adds: list[tuple] | None = None,
    ) -> BatchResult:
        """Process a batch read from `stream` and commit it; raises CommitConflict if it could not.

        `deliveries` (from XPENDING, for reclaimed entries) dead-letters entries delivered more
        than `max_deliveries` times. `extra_entries` are synthetic entries (abandon markers)
        that `extra_adds` (tuples of stream, field, value, ...) writes into the raw log in the
        same commit.
        """
        result = BatchResult()
        adds: list = [((a[0],), tuple(a[1:])) for a in extra_adds or ()]
        acks: list = []
        by_run: dict[str, list[Entry]] = {}
        max_bytes = self.settings.max_line_bytes
        max_deliveries = self.settings.max_deliveries
        for raw_id, fmap in zip(ids, fields):
            sid = raw_id.decode() if isinstance(raw_id, bytes) else raw_id
            acks.append(sid)
            if deliveries is not None and deliveries.get(sid, 0) > max_deliveries:
                self._dead_raw(adds, result, stream, sid, fmap, "max-deliveries",
                               f"delivered {deliveries[sid]} times")
                continue
            size = sum(map(len, fmap.values())) + sum(map(len, fmap))
            if size > max_bytes:
                self._dead_raw(adds, result, stream, sid, fmap, "oversize", f"{size} bytes > {max_bytes}")
                continue
            try:
                entry = parse_fields(fmap, sid)
            except EntryError as exc:
                self._dead_raw(adds, result, stream, sid, fmap, "invalid-entry", str(exc))
                continue
            by_run.setdefault(entry.run, []).append(entry)
        for entry in extra_entries:
            by_run.setdefault(entry.run, []).append(entry)

        computed: dict[str, tuple] = {}
        todo = list(by_run)
        try:
            for _attempt in range(MAX_ATTEMPTS):
                await self._compute(todo, by_run, computed)
                reply = await self.script(args=self._argv(stream, computed, acks, adds))
                if int(reply[0]) == 1:
                    break
                runs = list(computed)
                todo = [runs[int(i) - 1] for i in reply[1:]]
                for run in todo:
                    self._cache.pop(run, None)
                log.debug("commit conflict on %d runs, retrying", len(todo))
            else:
                raise CommitConflict(f"{len(todo)} runs kept changing under this worker")
        except BaseException:
            # The sequencers were mutated for a commit that did not happen.
            for run in by_run:
                self._cache.pop(run, None)
            raise

        now_ms = time.time_ns() // 1_000_000
        cache = self._cache
        for run, (version, _state, ended, _last, seq, outcome) in computed.items():
            if ended:
                cache.pop(run, None)
            else:
                cache[run] = (str(int(version) + 1), seq)
                cache.move_to_end(run)
            result.events.extend(outcome.events)
            result.records.extend(outcome.records)
            for rule, n in outcome.redactions.items():
                result.redactions[rule] = result.redactions.get(rule, 0) + n
            for entry, disposition, reason in outcome.dispositions:
                result.count(disposition, reason)
                if disposition == PROCESSED and entry.kind != "abandon":
                    result.latencies_ms.append(now_ms - sid_ms(entry.sid))
        while len(cache) > CACHE_RUNS:
            cache.popitem(last=False)
        return result

    async def _compute(self, runs: list[str], by_run: dict[str, list[Entry]], computed: dict) -> None:
        """Run each run's entries through its sequencer. A run this worker committed last is taken
        from the in-process cache (no round trip); the commit's version check catches a stale one."""
        if not runs:
            return
        settings = self.settings
        cache = self._cache
        missing = [run for run in runs if run not in cache]
        loaded: dict[str, tuple] = {}
        if missing:
            pipe = self.client.pipeline(transaction=False)
            for run in missing:
                pipe.hmget(state_key(settings, run), "v", "s")
            for run, (version, state) in zip(missing, await pipe.execute()):
                if state is None:
                    seq = RunSequencer(run, self.limits, settings.max_buffered_entries, self.redactor)
                else:
                    seq = RunSequencer.from_state(
                        orjson.loads(state), self.limits, settings.max_buffered_entries, self.redactor
                    )
                loaded[run] = ((version or b"0").decode(), seq)
        for run in runs:
            version, seq = loaded[run] if run in loaded else cache.pop(run)
            outcome = Outcome()
            last_ms = 0
            for entry in by_run[run]:
                seq.accept(entry, outcome)
                if entry.kind != "abandon":
                    last_ms = max(last_ms, sid_ms(entry.sid))
            computed[run] = (version, orjson.dumps(seq.to_state()), seq.ended, last_ms, seq, outcome)

    def _argv(self, stream: str, computed: dict, acks: list, base_adds: list) -> list:
        # Batches of several shards are processed concurrently: nothing batch-specific on self.
        s = self.settings
        runs = []
        adds = list(base_adds)
        now_ms = None
        for run, (version, state, ended, last_ms, _seq, outcome) in computed.items():
            if not last_ms:
                now_ms = now_ms or int(time.time() * 1000)
            runs.append((state_key(s, run), version, state, 1 if ended else 0, run, last_ms or now_ms))
            self._outputs(adds, outcome)
        return [stream, s.group, self.active, self.ttl_ms, _packb((runs, acks, adds))]

    def _outputs(self, adds: list, outcome: Outcome) -> None:
        dumps = orjson.dumps
        all_events = self.events_topic
        for event in outcome.events:
            etype = event["type"]
            fields = (b"eventId", event["eventId"], b"runId", event["runId"], b"seq", str(event["seq"]),
                      b"type", etype, b"data", dumps(event))
            adds.append(((all_events, self.topic(etype)), fields))
        for record in outcome.records:
            adds.append(((self.runs_topic,), (b"recordId", record["recordId"], b"runId", record["runId"],
                                              b"seq", str(record["seq"]), b"state", record["state"],
                                              b"data", dumps(record))))
        for entry, disposition, reason in outcome.dispositions:
            if disposition == DEAD:
                self._dead_fields(adds, entry.sid, entry_fields(entry), reason or "",
                                  _DETAILS.get(reason or "", ""),
                                  source=self.settings.raw_stream(shard_of(entry.run, self.settings.shards)))

    def _dead_raw(self, adds: list, result: BatchResult, stream: str, sid: str, fmap: dict, reason: str,
                  detail: str) -> None:
        result.count(DEAD, reason)
        flat: list = []
        for k, v in fmap.items():
            flat += [k, v]
        self._dead_fields(adds, sid, flat, reason, detail, source=stream)

    def _dead_fields(self, adds: list, sid: str, flat: list, reason: str, detail: str, source: str) -> None:
        fields: list = [b"reason", reason, b"detail", detail, b"source", source, b"sourceId", sid]
        for i in range(0, len(flat), 2):
            name = flat[i] if isinstance(flat[i], bytes) else str(flat[i]).encode()
            fields += [b"raw." + name, flat[i + 1]]
        adds.append(((self.deadletters,), tuple(fields)))

_DETAILS = {
    "after-end": "the run had already ended (eof or abandoned) and this seq is not part of it",
    "out-of-window": "seq is too far ahead of the run's next expected seq",
}

__all__ = ["BatchProcessor", "BatchResult", "CommitConflict", "state_key", "active_key"]
