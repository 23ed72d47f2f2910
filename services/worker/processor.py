"""One batch of raw entries of one shard -> one atomic commit. The imperative shell around RunSequencer.

Steps: validate every entry (dead letters for what cannot be processed), group by run, load the
touched runs' states (or take them from the in-process cache), run each run's entries through its
sequencer, commit (services/worker/commit.py), retry the runs whose version moved.

Totality (nothing a tap writes can cost another run its data):
- validation is total (services/sequencer/entries.py); a dead-lettered entry whose run and seq
  are known makes that run report the seq missing (`RunSequencer.lose`);
- a run whose processing raises is recomputed in guarded mode, where only the entry that raises
  is dead-lettered (`processing-error`); if even that fails, that run's entries of the batch are
  dead-lettered and its state is left as it was;
- a commit that Redis refuses (not a conflict, not a broker outage) is bisected: each half is
  processed and committed on its own, down to the single entry, which is dead-lettered.

Steps: the computation of a batch is a series of bounded steps, and between two steps it calls
`pulse()`. The worker sets that to the shard leases' `renew_if_due` (services/worker/leases.py),
so however long a batch computes, its leases are renewed on time and its commit is not fenced
off. A step is one event's redaction (the sequencers get the redactor wrapped in `_StepRedactor`:
the costly part, and it happens where the core decides, e.g. every pending tool call of a run at
its eof at once), or at most STEP_CHARS characters of a run's lines (cutting a run's entries into
several `accept_many` calls changes nothing: it is defined as one `accept` per entry).

A broker outage (a lost connection, a failover, a topology change: `services/broker/errors.py`,
`is_outage`) is not the batch's fault: the same read or commit is sent again at once, then with a
short backoff, on whatever topology the client has found meanwhile, for up to CLAIM_IDLE_MS. Only
then does the error leave the handler (the entries stay pending for the reclaim). So entries of
shards whose primary survived a failover are committed as soon as the client has re-read the slot
map, not CLAIM_IDLE_MS later. Sending a commit again is safe: if the first one was executed and
only its reply was lost, the version check refuses the second (a conflict: the runs are reloaded,
and their entries are then duplicates of what the first commit wrote).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import orjson
from redis.exceptions import ResponseError

from contracts.deadletters import DeadLetter
from contracts.raw import (
    ABANDON,
    AFTER_END,
    DEAD,
    HOLD_LIMIT,
    INVALID_ENTRY,
    MAX_DELIVERIES,
    OUT_OF_WINDOW,
    PROCESSING_ERROR,
    stream_id_ms,
)
from contracts.topics import event_fields, record_fields
from services.backoff import Backoff
from services.broker.errors import describe, is_outage, is_transient
from services.normalizer import Limits
from services.sequencer import (
    Entry,
    HeldChanges,
    Outcome,
    Rejected,
    RunSequencer,
    parse_batch,
    tally,
)
from services.sequencer.feed import Lost, RunItem, feed, lost_of, rejected_loss, wrong_shard
from services.settings import Settings
from services.worker.commit import (
    STATE_FIELD,
    VERSION_FIELD,
    Commit,
    CommitFailed,
    Committer,
    Output,
    RunWrite,
    decode_calls,
    decode_held,
)

if TYPE_CHECKING:
    from services.worker.spread import Spread

log = logging.getLogger("goose_ingest.worker")
T = TypeVar("T")

# Attempts before a batch is given up (its entries then wait for a reclaim, claim_idle_ms later).
# With the backoff below, 32 attempts last up to ~5 s; 8 without it were used up by 3 workers
# sharing 1,000 runs, and the 30 s reclaim wait cut their throughput to a tenth (bench/scale.py).
MAX_ATTEMPTS = 32
# After a commit conflict (another worker commits the same runs), cached runs are checked against
# their stored version for this long: reading them with the uncached ones costs no extra round
# trip, and computing from a stale cache would only make the commit conflict again.
SHARED_RUNS_S = 30.0
# Workers committing the same runs at once keep invalidating each other's retries. From the second
# retry on, a worker waits a random time, doubling per attempt, so that one of them commits first.
CONFLICT_BACKOFF_S = 0.002
MAX_CONFLICT_BACKOFF_S = 0.2
# A broker outage: the first retry goes at once (a MOVED or a lost connection is usually over by the
# time redis-py has re-read the slot map), the next ones back off up to this.
OUTAGE_BACKOFF_S = 0.05
MAX_OUTAGE_BACKOFF_S = 1.0
# The computation's step (see the module's docstring): ~0.25 s of the slowest lines measured
# (a 475 KB line that is all flags to redact costs ~0.9 s), so `pulse` runs several times a second
# in a long batch and a normal batch (lines of a few KB) makes only a few calls.
STEP_CHARS = 128 * 1024
_DETAILS = {
    AFTER_END: "the run had already ended (eof or abandoned) and this seq is not part of it",
    OUT_OF_WINDOW: "seq is too far ahead of the run's next expected seq",
    HOLD_LIMIT: "the run already holds MAX_HELD_BYTES of out-of-order entries",
}


class CommitConflict(RuntimeError):
    """Another worker kept committing the same runs; the entries stay pending for a retry."""


@dataclass
class BatchResult:
    outcomes: dict[str, int] = field(default_factory=dict)  # outcome -> entries
    dead: dict[str, int] = field(default_factory=dict)  # reason -> entries
    events: list[dict[str, Any]] = field(default_factory=list)
    # the same events by the format of their run (None: not decided yet), for the metrics' label
    events_by_format: dict[str | None, list[dict[str, Any]]] = field(default_factory=dict)
    records: list[dict[str, Any]] = field(default_factory=list)
    # stream ids of the processed entries (not abandon markers) and when the batch was settled: the
    # metrics sample their latency (`latencies_ms`) instead of paying for every entry's
    processed_ids: list[str] = field(default_factory=list)
    settled_ms: int = 0
    redactions: dict[str, int] = field(default_factory=dict)  # rule -> replacements
    evictions: dict[str, int] = field(default_factory=dict)  # cap -> pending tool calls surfaced early
    hosts: dict[str, str | None] = field(default_factory=dict)  # run -> its `host` label, for runs with events

    def count(self, outcome: str, reason: str | None = None) -> None:
        """One entry's outcome (the batch's dispositions are added by ``tally``, the same rule)."""
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        if reason is not None:
            self.dead[reason] = self.dead.get(reason, 0) + 1

    def merge(self, other: BatchResult) -> None:
        for outcome, n in other.outcomes.items():
            self.outcomes[outcome] = self.outcomes.get(outcome, 0) + n
        for reason, n in other.dead.items():
            self.dead[reason] = self.dead.get(reason, 0) + n
        self.events += other.events
        for fmt, events in other.events_by_format.items():
            self.events_by_format.setdefault(fmt, []).extend(events)
        self.records += other.records
        self.processed_ids += other.processed_ids
        self.settled_ms = max(self.settled_ms, other.settled_ms)
        for rule, n in other.redactions.items():
            self.redactions[rule] = self.redactions.get(rule, 0) + n
        for cap, n in other.evictions.items():
            self.evictions[cap] = self.evictions.get(cap, 0) + n
        self.hosts.update(other.hosts)

    def latencies_ms(self, step: int = 1) -> list[int]:
        """Redis clock at the entry's append -> settled, for every `step`-th processed entry."""
        return [self.settled_ms - stream_id_ms(sid) for sid in self.processed_ids[::step]]


@dataclass
class RunResult:
    """One run's part of a batch, computed but not yet committed."""

    run: str
    version: str  # the version the computation started from
    sequencer: RunSequencer
    outcome: Outcome
    last_ms: int
    held: HeldChanges  # taken once when computed: a retried commit must write them again


@dataclass
class _Batch:
    """A validated batch: entries by run (in stream order), and what is already decided."""

    shard: int
    acks: list[str] = field(default_factory=list)
    by_run: dict[str, list[RunItem]] = field(default_factory=dict)
    dead: list[Output] = field(default_factory=list)  # dead letters decided before the sequencers
    control: dict[str, Output] = field(default_factory=dict)  # run -> its abandon marker
    result: BatchResult = field(default_factory=BatchResult)


class BatchProcessor:
    def __init__(self, settings: Settings, client: Any, lease_owner: str | None = None) -> None:
        self.settings = settings
        # With shard leases (services/worker/leases.py) every commit is fenced by the shard's lease.
        self.lease_owner = lease_owner
        self.layout = settings.layout
        self.client = client
        self.committer = Committer(client)
        self.limits = Limits(settings.max_span_chars, settings.max_pending_tools, settings.max_pending_tool_bytes)
        redactor = settings.redactor()
        self.redactor = None if redactor is None else _StepRedactor(redactor, self)
        self.ttl_ms = int(settings.run_state_ttl_hours * 3_600_000)
        self._topics: dict[tuple[str, int], str] = {}
        # Run sequencers kept between batches (LRU, `run_cache_size`): what bounds the worker's RSS.
        self._cache: OrderedDict[str, tuple[str, RunSequencer]] = OrderedDict()
        self._cache_size = settings.run_cache_size
        self._check_cache_until = 0.0  # monotonic time until which cached runs are version-checked
        self.conflicts = 0  # runs whose commit met a moved version (each was recomputed)
        self.outage_retries = 0  # reads and commits sent again because of a broker outage
        # Called between two steps of a batch's computation (see the module's docstring).
        self.pulse: Callable[[], None] = _no_pulse
        # Runs and hosts failing per class and tool (services/worker/spread.py), counted after each commit.
        self.spread: Spread | None = None

    def new_sequencer(self, run: str) -> RunSequencer:
        s = self.settings
        return RunSequencer(run, self.limits, s.max_buffered_entries, self.redactor, s.max_held_bytes)

    def _type_partition(self, event_type: str, shard: int) -> str:
        name = self._topics.get((event_type, shard))
        if name is None:
            name = self._topics[(event_type, shard)] = self.layout.type_partition(event_type, shard)
        return name

    # ------------------------------------------------------------------ entry points
    async def process(
        self,
        shard: int,
        ids: Sequence[bytes | str],
        fields: Sequence[dict[bytes, bytes]],
        deliveries: dict[str, int] | None = None,
    ) -> BatchResult:
        """Process a batch read from raw shard `shard` and commit it; raises CommitConflict if it
        could not. `deliveries` (from XPENDING, for reclaimed entries) dead-letters entries
        delivered more than `max_deliveries` times."""
        sids = [i.decode() if isinstance(i, bytes) else i for i in ids]
        try:
            return await self._commit_batch(self._validate(shard, sids, fields, deliveries))
        except CommitFailed as exc:
            if len(sids) > 1:
                half = len(sids) // 2
                log.warning("commit of %d entries failed (%s): committing each half on its own", len(sids), exc)
                result = await self.process(shard, sids[:half], fields[:half], deliveries)
                result.merge(await self.process(shard, sids[half:], fields[half:], deliveries))
                return result
            if not sids:
                raise
            log.warning("commit of entry %s failed (%s): dead-lettering it", sids[0], exc)
            batch = _Batch(shard, acks=list(sids))
            self._dead_raw(batch, sids[0], fields[0], PROCESSING_ERROR, f"commit failed: {exc}")
            return await self._commit_batch(batch)

    async def abandon(self, run: str, marker: Entry) -> BatchResult:
        """Write an abandon marker on the run's control stream and apply it, in one commit."""
        shard = self.layout.shard_of(run)
        batch = _Batch(shard)
        batch.by_run[run] = [marker]
        batch.control[run] = Output((self.layout.control_stream(shard),), _flat(marker.to_fields()))
        return await self._commit_batch(batch)

    # ------------------------------------------------------------------ validation
    def _validate(self, shard: int, sids: list[str], fields: Sequence[dict[bytes, bytes]],
                  deliveries: dict[str, int] | None) -> _Batch:
        batch = _Batch(shard, acks=list(sids))
        max_deliveries = self.settings.max_deliveries
        shard_of = self.layout.shard_of if self.layout.cluster else None
        by_run = batch.by_run
        parsed = parse_batch(sids, list(fields), self.settings.max_line_bytes)  # the per-entry loop, in the core
        for sid, fmap, entry in zip(sids, fields, parsed, strict=True):
            if deliveries is not None and deliveries.get(sid, 0) > max_deliveries:
                self._dead_raw(batch, sid, fmap, MAX_DELIVERIES, f"delivered {deliveries[sid]} times", lost=True)
                continue
            if type(entry) is Rejected:
                self._dead_raw(batch, sid, fmap, entry.reason, entry.detail)
                lost = rejected_loss(entry, fmap, sid)  # the rule replay applies too
                if lost is not None:
                    self._lose(batch, lost.run, lost.seq, sid, lost.reason)
                continue
            assert type(entry) is Entry
            misplaced = wrong_shard(entry.run, shard, shard_of)
            if misplaced is not None:
                # Its state lives in another slot: committing it here would be a cross-slot write.
                self._dead_raw(batch, sid, fmap, INVALID_ENTRY, misplaced)
                continue
            by_run.setdefault(entry.run, []).append(entry)
        return batch

    def _lose(self, batch: _Batch, run: str, seq: int, sid: str, reason: str | None = None) -> None:
        if wrong_shard(run, batch.shard, self.layout.shard_of if self.layout.cluster else None) is not None:
            return  # not this shard's run: its own shard's worker never sees the seq either
        batch.by_run.setdefault(run, []).append(Lost(run, seq, sid, reason))

    # ------------------------------------------------------------------ compute + commit
    async def _commit_batch(self, batch: _Batch) -> BatchResult:
        computed: dict[str, RunResult] = {}
        todo = list(batch.by_run)
        # from the third attempt on: a random wait up to CONFLICT_BACKOFF_S * 2**attempt (capped)
        conflict_backoff = Backoff(CONFLICT_BACKOFF_S * 4, MAX_CONFLICT_BACKOFF_S, jitter=True)
        try:
            for attempt in range(MAX_ATTEMPTS):
                if attempt >= 2:
                    await asyncio.sleep(conflict_backoff.next())
                await self._compute(todo, batch, computed)
                commit = self._commit(batch, computed)
                conflicts = await self.through_outage(functools.partial(self.committer.commit, commit))
                if commit.retaken:
                    log.warning("the lease of shard %d expired under a batch and nobody had taken it: the batch's "
                                "commit took it back", batch.shard)
                if not conflicts:
                    break
                runs = list(computed)
                todo = [runs[i] for i in conflicts]
                self.conflicts += len(todo)
                self._check_cache_until = time.monotonic() + SHARED_RUNS_S
                for run in todo:
                    self._cache.pop(run, None)
                log.debug("commit conflict on %d runs, retrying", len(todo))
            else:
                raise CommitConflict(f"{len(todo)} runs kept changing under this worker")
        except BaseException:
            # The sequencers were mutated for a commit that did not happen.
            for run in batch.by_run:
                self._cache.pop(run, None)
            raise
        result = self._settle(batch, computed)
        if self.spread is not None and result.events:
            await self.spread.record(result.events, result.hosts)  # best effort: never raises a broker error
        return result

    def _settle(self, batch: _Batch, computed: dict[str, RunResult]) -> BatchResult:
        """After a successful commit: cache the sequencers, tally the result."""
        result = batch.result
        result.settled_ms = time.time_ns() // 1_000_000
        processed_ids = result.processed_ids
        cache = self._cache
        for run, rr in computed.items():
            if rr.sequencer.ended:
                cache.pop(run, None)
            else:
                cache[run] = (str(int(rr.version) + 1), rr.sequencer)
                cache.move_to_end(run)
            outcome = rr.outcome
            result.events.extend(outcome.events)
            if outcome.events:
                result.events_by_format.setdefault(rr.sequencer.norm.format, []).extend(outcome.events)
                result.hosts[run] = rr.sequencer.host
            result.records.extend(outcome.records)
            for rule, n in outcome.redactions.items():
                result.redactions[rule] = result.redactions.get(rule, 0) + n
            for cap, n in outcome.evictions.items():
                result.evictions[cap] = result.evictions.get(cap, 0) + n
            tally(outcome.dispositions, result.outcomes, result.dead, processed_ids)
        while len(cache) > self._cache_size:
            cache.popitem(last=False)
        return result

    async def load(self, runs: list[str], reuse: dict[str, tuple[str, RunSequencer]] | None = None,
                   ) -> dict[str, tuple[str, RunSequencer] | Exception]:
        """Each run's version and sequencer, or the exception that makes its stored state unusable
        (a key of another type, a state that does not decode): that run alone is given up.
        A run in `reuse` whose stored version is still the one given there is not decoded again."""
        loaded: dict[str, tuple[str, RunSequencer] | Exception] = {}
        for run, fields in zip(runs, await self.through_outage(lambda: self._read_states(runs)), strict=True):
            if isinstance(fields, Exception):
                loaded[run] = fields
                continue
            kept = reuse.get(run) if reuse is not None else None
            if kept is not None and isinstance(fields, dict) and kept[0].encode() == (fields.get(VERSION_FIELD) or b"0"):
                loaded[run] = kept
                continue
            try:
                loaded[run] = self._decode_state(run, fields)
            except Exception as exc:  # a corrupt or foreign state: never a reason to stop the shard
                loaded[run] = exc
        return loaded

    async def _read_states(self, runs: list[str]) -> list[Any]:
        """HGETALL of each run's state; a refusal of one key (not an outage) is that run's reply."""
        pipe = self.client.pipeline(transaction=False)
        for run in runs:
            pipe.hgetall(self.layout.run_state(run))
        replies = await pipe.execute(raise_on_error=False)
        for reply in replies:
            if isinstance(reply, Exception) and (not isinstance(reply, ResponseError) or is_transient(reply)):
                raise reply
        return list(replies)

    async def through_outage(self, call: Callable[[], Awaitable[T]]) -> T:
        """`call()`, sent again while the broker has an outage (see the module's docstring), for up to
        CLAIM_IDLE_MS; then the outage's error is raised."""
        deadline = time.monotonic() + self.settings.claim_idle_ms / 1000
        backoff = Backoff(OUTAGE_BACKOFF_S, MAX_OUTAGE_BACKOFF_S, immediate=True)  # a blip: sent again at once
        retries = 0
        while True:
            try:
                result = await call()
            except Exception as exc:
                if not is_outage(exc) or time.monotonic() + backoff.delay > deadline:
                    raise
                if retries == 0:
                    log.warning("broker outage during a batch (%s): sending it again", describe(exc))
                retries += 1
                self.outage_retries += 1
                await asyncio.sleep(backoff.next())
                continue
            if retries:
                log.info("broker back after %d retries: batch sent", retries)
            return result

    def _decode_state(self, run: str, fields: dict[bytes, bytes]) -> tuple[str, RunSequencer]:
        s = self.settings
        state = fields.get(STATE_FIELD)
        if state is None:
            sequencer = self.new_sequencer(run)
        else:
            sequencer = RunSequencer.from_state(orjson.loads(state), self.limits, s.max_buffered_entries,
                                                self.redactor, s.max_held_bytes, held=decode_held(fields),
                                                calls=decode_calls(fields))
        return (fields.get(VERSION_FIELD) or b"0").decode(), sequencer

    async def _compute(self, runs: list[str], batch: _Batch, computed: dict[str, RunResult]) -> None:
        """Run each run's entries through its sequencer. A run this worker committed last is taken
        from the in-process cache (no round trip); the commit's version check catches a stale one."""
        if not runs:
            return
        cache = self._cache
        if self._check_cache_until > time.monotonic():
            # Runs are shared with other workers: a cached run counts only at its stored version.
            loaded = await self.load(runs, reuse=cache)
            for run in runs:
                cache.pop(run, None)
        else:
            loaded = await self.load([run for run in runs if run not in cache])
        for run in runs:
            got = loaded[run] if run in loaded else cache.pop(run)
            items = batch.by_run[run]
            if isinstance(got, Exception):
                log.error("run %s: its stored state is unusable (%s); its entries are dead-lettered",
                          run, type(got).__name__)
                computed.pop(run, None)
                self._give_up(batch, run, items, f"run state unusable ({type(got).__name__})")
                continue
            version, sequencer = got
            try:
                computed[run] = self._feed(run, version, sequencer, items)
            except Exception as exc:
                log.warning("processing run %s raised %s: retrying it entry by entry", run, type(exc).__name__)
                again = (await self.load([run]))[run]
                if isinstance(again, Exception):
                    computed.pop(run, None)
                    self._give_up(batch, run, items, f"run state unusable ({type(again).__name__})")
                    continue
                version, sequencer = again
                sequencer.guarded = True
                try:
                    computed[run] = self._feed(run, version, sequencer, items)
                except Exception as again:
                    log.error("run %s: %s even entry by entry; its entries of this batch are dead-lettered",
                              run, type(again).__name__)
                    computed.pop(run, None)
                    self._give_up(batch, run, items, type(again).__name__)
                finally:
                    sequencer.guarded = False

    def _feed(self, run: str, version: str, sequencer: RunSequencer, items: list[RunItem]) -> RunResult:
        # the loop replay runs too (services/sequencer/feed.py), in steps that renew the leases
        fed = feed(sequencer, items, step=self.pulse, step_chars=STEP_CHARS)
        return RunResult(run, version, sequencer, fed.outcome, fed.last_ms, sequencer.take_held_changes())

    def _give_up(self, batch: _Batch, run: str, items: list[RunItem], error: str) -> None:
        del batch.by_run[run]
        for item in items:
            if isinstance(item, Entry) and item.kind != ABANDON:
                batch.result.count(DEAD, PROCESSING_ERROR)
                self._dead_output(batch.dead, item.sid, item.to_fields(), PROCESSING_ERROR, error, batch.shard)

    def _commit(self, batch: _Batch, computed: dict[str, RunResult]) -> Commit:
        # Batches of several shards are processed concurrently: nothing batch-specific on self.
        layout = self.layout
        shard = batch.shard
        commit = Commit(layout.raw_stream(shard), self.settings.group, layout.active_runs(shard), self.ttl_ms,
                        acks=batch.acks, outputs=list(batch.dead))
        if self.lease_owner is not None:
            commit.lease, commit.owner = layout.shard_lease(shard), self.lease_owner
            commit.lease_ttl_ms, commit.claim_idle_ms = self.settings.lease_ttl_ms, self.settings.claim_idle_ms
        # With thousands of active runs a batch carries one line of many runs: what is the same
        # for all of them is worked out once per batch, not once per run.
        all_events, runs_topic = layout.events_partition(shard), layout.runs_partition(shard)
        dumps = orjson.dumps
        for run, rr in computed.items():
            if run in batch.control:  # only with the run it applies to: replay applies what the log says
                commit.outputs.append(batch.control[run])
            sequencer = rr.sequencer
            commit.runs.append(RunWrite(layout.run_state(run), rr.version,
                                        dumps(sequencer.to_state(include_held=False)), sequencer.ended, run,
                                        rr.last_ms, rr.held))
            self._outputs(commit.outputs, rr.outcome, shard, all_events, runs_topic)
        return commit

    def _outputs(self, outputs: list[Output], outcome: Outcome, shard: int, all_events: str,
                 runs_topic: str) -> None:
        for event in outcome.events:
            etype = event["type"]
            outputs.append(Output((all_events, self._type_partition(etype, shard)), event_fields(event)))
        for record in outcome.records:
            outputs.append(Output((runs_topic,), record_fields(record)))
        for d in outcome.dispositions:
            if d.outcome == DEAD:
                reason = d.reason or ""
                self._dead_output(outputs, d.entry.sid, d.entry.to_fields(), reason,
                                  d.detail or _DETAILS.get(reason, ""), shard)

    def _dead_raw(self, batch: _Batch, sid: str, fmap: dict[bytes, bytes], reason: str, detail: str,
                  lost: bool = False) -> None:
        batch.result.count(DEAD, reason)
        self._dead_output(batch.dead, sid, fmap, reason, detail, batch.shard)
        if lost:
            item = lost_of(fmap, sid, reason)
            if item is not None:
                self._lose(batch, item.run, item.seq, sid, item.reason)

    def _dead_output(self, outputs: list[Output], sid: str, fmap: dict[bytes, bytes], reason: str, detail: str,
                     shard: int) -> None:
        letter = DeadLetter(reason, detail, self.layout.raw_stream(shard), sid, raw=fmap)  # contracts/deadletters.py
        outputs.append(Output((self.layout.deadletter_partition(shard),), letter.flat()))


def _no_pulse() -> None:
    return None


class _StepRedactor:
    """The processor's redactor as the sequencers see it: each event's redaction is one step of the
    computation, so the processor's `pulse` runs before it (the sequencers take any redactor)."""

    __slots__ = ("_redactor", "_processor")

    def __init__(self, redactor: Any, processor: BatchProcessor) -> None:
        self._redactor = redactor
        self._processor = processor

    def redact_event(self, event: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        self._processor.pulse()
        return self._redactor.redact_event(event, *args, **kwargs)

    def redact_text(self, text: str) -> Any:
        return self._redactor.redact_text(text)

    def __getattr__(self, name: str) -> Any:  # rule_names and the rest: the redactor's own
        return getattr(self._redactor, name)


def _flat(fields: dict[bytes, bytes]) -> tuple[bytes, ...]:
    out: list[bytes] = []
    for name, value in fields.items():
        out += [name, value]
    return tuple(out)


__all__ = ["BatchProcessor", "BatchResult", "CommitConflict", "Lost", "RunResult"]
