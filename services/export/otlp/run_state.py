"""The OTLP exporter's per-run state in the broker (issue 33 item 5: one job of what was
processor.py's `TraceExporter`): keys, the Lua scripts that record, adopt and close it, its reads.

Per run and consumer group, a hash at ``layout.export_group_state("otlp", group, run)`` holds what
a root span needs until the run ends, so any replica can finish any run and a crash resumes where
the acks stopped. Each group has its own (issue 20 item 5): two groups (two backends, a re-export
from scratch) each export every root. Its size is bounded whatever the run's length (issue 22 §3):

- ``r:<k>``  the run's lifecycle records (folded by `mapping.fold_records`), ``rn`` = 1 + highest k;
- ``v:<slot>`` the root's span events, a ring of ``ring`` slots (slot = seq mod ring; a slot keeps
  the highest seq it was offered), each ``<seq> <event JSON>`` of at most `STATE_EVENT_BYTES` / ring
  bytes (a larger event is kept without its attributes); ``ne`` how many distinct non-tool events came;
- which seqs were seen, for counting each event once: ``w`` (every seq below it was seen) and
  ``s:<seq>`` marks above it (``sc`` of them, at most `SEEN_WINDOW`: past it, ``w`` jumps to the
  lowest mark, and a seq below that arriving later is taken as seen);
- ``n`` how many distinct events were seen, ``exp`` how many the terminal record says there are,
  ``first``/``last`` the earliest/latest event time;
- ``done`` (root exported: why) or ``dead`` (the run's export was dead-lettered: why);
- ``legacy``: state adopted from an exporter of before (one state for every group; ``e:<seq>``,
  ``t:<seq>`` fields, unbounded), finished as it was written.

Every call here is one broker command or script, idempotent: the exporter runs each through its
in-place retry of broker refusals (processor.py `_broker`).
"""

from __future__ import annotations

import logging
from importlib import resources
from typing import Any

from services.export.otlp.batch import RunFlags, RunWork, as_text
from services.export.otlp.mapping import MappingConfig
from services.settings import Settings

log = logging.getLogger("goose_ingest.export.otlp")

EXPORTER = "otlp"
DETAIL_CHARS = 1000
# Bounds of a run's export state (issue 22 §3): the root keeps at most `ring` span events (the SDK's
# event count limit, OTEL_SPAN_EVENT_COUNT_LIMIT, within [1, MAX_RING]), of at most STATE_EVENT_BYTES
# in all (an equal share per slot: which events keep their attributes never depends on arrival
# order); seen-marks of out-of-order seqs at most SEEN_WINDOW (a redelivery runs a batch or a few
# behind, far less than this).
DEFAULT_RING = 128
MAX_RING = 10_000
STATE_EVENT_BYTES = 4 * 1024 * 1024
SEEN_WINDOW = 10_000

# The broker-side halves of a run's state, in .lua files beside this module (each file says its
# KEYS, ARGV and reply): recording a batch, adopting a state of before, closing a run.
_NOTE_LUA = resources.files("services.export.otlp").joinpath("note.lua").read_text()
_ADOPT_LUA = resources.files("services.export.otlp").joinpath("adopt.lua").read_text()
_CLOSE_LUA = resources.files("services.export.otlp").joinpath("close.lua").read_text()


def ring_of(cfg: MappingConfig) -> int:
    """The ring's slots: the SDK's span event limit, within [1, MAX_RING]."""
    limit = cfg.limits.max_events
    return min(MAX_RING, limit) if isinstance(limit, int) and limit > 0 else DEFAULT_RING


class RunStates:
    def __init__(self, settings: Settings, client: Any, group: str, ring: int) -> None:
        self.layout = settings.layout
        self.client = client
        self.group = group
        self.ring = ring
        self.ttl_s = max(1, int(settings.run_state_ttl_hours * 3600))
        self._note = client.register_script(_NOTE_LUA)
        self._close = client.register_script(_CLOSE_LUA)
        self._adopt = client.register_script(_ADOPT_LUA)

    # ------------------------------------------------------------------ names
    def key(self, run: str) -> str:
        return self.layout.export_group_state(EXPORTER, self.group, run)

    def open_key(self, run: str) -> str:
        return self.layout.export_group_open_runs(EXPORTER, self.group, self.layout.shard_of(run))

    def open_sets(self) -> list[str]:
        return self.layout.export_group_open_run_sets(EXPORTER, self.group)

    # ------------------------------------------------------------------ writes
    async def adopt_legacy(self, chunk: int = 500) -> int:
        """Runs left open by an exporter of before (one state shared by every group) move into
        this group's state, so an upgrade loses no open root. The first exporter to start after
        the upgrade takes them all (before, every group read and wrote that one state)."""
        adopted = 0
        for old_open in sorted(set(self.layout.export_open_runs(EXPORTER, i) for i in range(self.layout.shards))):
            while True:
                members = await self.client.zrange(old_open, 0, chunk - 1)
                if not members:
                    break
                for member in members:
                    run = as_text(member) or ""
                    keys = [self.layout.export_state(EXPORTER, run), old_open, self.key(run), self.open_key(run)]
                    adopted += int(await self._adopt(keys=keys, args=[member]))
        if adopted:
            log.info("adopted the export state of %d open runs from before per-group state (group %s)", adopted, self.group)
        return adopted

    async def note(self, run: str, w: RunWork, now_ms: int) -> tuple[int, int, int]:
        """Record a batch's records and events of a run (each seq once): (seen, expected or -1, closed)."""
        args: list[Any] = [
            run,
            now_ms,
            "" if w.min_ns is None else w.min_ns,
            "" if w.max_ns is None else w.max_ns,
            "" if w.exp is None else w.exp,
            self.ring,
            SEEN_WINDOW,
        ]
        for k, record in w.records.items():
            args.extend(("r", k, record))
        for seq, ev in w.events.items():
            args.extend(("t", seq, b"") if ev is None else ("e", seq, ev))
        n, exp, closed = await self._note(keys=[self.key(run), self.open_key(run)], args=args)
        return n, exp, closed

    async def close(self, run: str, how: str, why: str) -> None:
        """`how`: "done" (the root is out) or "dead" (dead-lettered); kept for the state's TTL."""
        await self._close(keys=[self.key(run), self.open_key(run)], args=[run, how, why[:DETAIL_CHARS], self.ttl_s])

    async def forget_open(self, run: str) -> None:
        """A run found closed already leaves its open set."""
        await self.client.zrem(self.open_key(run), run)

    # ------------------------------------------------------------------ reads
    async def flags(self, work: dict[str, RunWork]) -> dict[str, RunFlags]:
        """The RunFlags of each run's state.

        complete: the root went out because every event its terminal record counts had been seen;
        sent: the seqs of this batch's tool events already seen. An event is noted seen only after
        its spans were accepted (the exporter's `_finish_batch`), so the tool spans of a seen event,
        and all of a complete run's, are out already: a redelivery (a group recreated at 0, a batch
        re-read after a crash between the note and the ack) must not send them again. What stays
        is the window between the collector's acceptance and the note."""
        pipe = self.client.pipeline(transaction=False)
        runs = list(work)
        for run in runs:
            seqs = [seq for seq, _ in work[run].tool_spans]
            pipe.hmget(self.key(run), "done", "dead", "w", *[f"s:{q}" for q in seqs], *[f"t:{q}" for q in seqs])
        answers = await pipe.execute()
        out: dict[str, RunFlags] = {}
        for run, values in zip(runs, answers, strict=True):
            done, dead, mark = values[0], values[1], int(values[2] or 0)
            seqs = [seq for seq, _ in work[run].tool_spans]
            marks, legacy = values[3:3 + len(seqs)], values[3 + len(seqs):]
            sent = {q for q, m, t in zip(seqs, marks, legacy, strict=True) if q < mark or m is not None or t is not None}
            out[run] = RunFlags(done is not None, dead is not None, done is not None and done != b"timeout", sent)
        return out

    async def read(self, run: str) -> dict[str, bytes]:
        """What the root needs of a run's state: never the seen-marks, so the read stays as small
        as the ring however long the run (one HGETALL of a 200,000-event state blocked Redis 163 ms)."""
        key = self.key(run)
        head = ["done", "dead", "first", "last", "rn", "ne", "legacy"]
        values = await self.client.hmget(key, head)
        state = {name: v for name, v in zip(head, values, strict=True) if v is not None}
        if "legacy" in state:
            return {(as_text(k) or ""): v for k, v in (await self.client.hgetall(key)).items()}
        if not state or "done" in state or "dead" in state:
            return state
        names = [f"r:{k}" for k in range(int(state.get("rn") or 0))] + [f"v:{i}" for i in range(self.ring)]
        values = await self.client.hmget(key, names)
        state.update((name, v) for name, v in zip(names, values, strict=True) if v is not None)
        return state

    async def idle(self, cutoff_ms: int, limit: int) -> list[str]:
        """Runs without news since `cutoff_ms`, at most `limit` per open set."""
        runs: list[str] = []
        for key in self.open_sets():
            for member in await self.client.zrangebyscore(key, "-inf", cutoff_ms, start=0, num=limit):
                run = as_text(member)
                if run is not None:
                    runs.append(run)
        return runs

    async def open_count(self) -> int:
        total = 0
        for key in self.open_sets():
            total += await self.client.zcard(key)
        return total
