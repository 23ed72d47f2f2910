"""Unanswered tool calls: the cost of a small line after N large calls that are never answered.

The case of issue 22: Claude Code `tool_use` blocks with 900 KB inputs and no result, then small
lines. Each pending call's block is one field of the run's state hash (services/worker/commit.py),
written once; the state `s` keeps only its id, name, seq, ts, size and where its input lies. So a
small line's commit should cost the same whatever N is, and N past the byte cap
(MAX_PENDING_TOOL_BYTES) changes nothing either. This measures it through the in-process
BatchProcessor (real commit.lua on a private redis-server), each small line its own batch as a
live run's lines are.

Figures per N: µs per small line (median), bytes Redis received per small line (INFO stats
total_net_input_bytes: what the commit wrote), the largest state `s`, the pending calls' fields and
bytes, and what a state keeping the calls inline with their inputs twice (the layout before) would
have made every small line send. Variants interleave because the CPU speed here drifts.

    python bench/pending_tools.py [--calls 0,5,10,20,40] [--input-kb 900] [--small 20] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import orjson
import redis

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from services.broker.connect import async_client  # noqa: E402
from services.broker.embedded import start_redis  # noqa: E402
from services.sequencer import Entry  # noqa: E402
from services.settings import Settings  # noqa: E402
from services.streams.groups import ensure_groups  # noqa: E402
from services.worker.commit import CALL_PREFIX  # noqa: E402
from services.worker.processor import BatchProcessor  # noqa: E402

TS = 1_790_000_000_000


@dataclass
class Figures:
    calls: int
    us_per_line: float
    bytes_per_line: float
    max_state: int
    call_fields: int
    call_bytes: int
    inline_state: int  # the state with the calls inline, input twice (as before): what each line rewrote
    evicted: int


def big_call(i: int, size: int) -> str:
    block = {"type": "tool_use", "id": f"toolu_{i:04d}", "name": "Write",
             "input": {"file_path": f"/w/{i}.txt", "content": "x" * size}}
    return orjson.dumps({"type": "assistant", "session_id": "s",
                         "message": {"id": f"msg_{i}", "role": "assistant", "content": [block]}}).decode()


def small_line(i: int) -> str:
    return orjson.dumps({"type": "assistant", "message": {"id": f"m{i}", "content": [{"type": "text", "text": "ok"}]}}).decode()


def entry(run: str, seq: int, line: str) -> Entry:
    return Entry.of_line(run, seq, TS + seq, line, host="bench", agent="claude/2",
                         format="claude-code" if seq == 0 else None)


def net_in(client: redis.Redis) -> int:
    return int(client.info("stats")["total_net_input_bytes"])


async def measure(settings: Settings, sync: redis.Redis, calls: int, input_size: int, small: int) -> Figures:
    layout = settings.layout
    stream = layout.raw_stream(0)
    run = f"bench/pending-{calls}"
    key = layout.run_state(run)
    client = async_client(settings)

    def read() -> tuple[list[str], list[dict[bytes, bytes]]]:
        reply = sync.xreadgroup(settings.group, "bench", {stream: ">"}, count=100_000)
        items = reply[0][1] if reply else []
        return [sid.decode() for sid, _ in items], [f for _, f in items]

    try:
        await ensure_groups(client, settings)
        processor = BatchProcessor(settings, client)
        evicted = 0
        for i in range(calls):  # the large calls, a batch each (as they would arrive)
            sync.xadd(stream, entry(run, i, big_call(i, input_size)).to_fields())
            result = await processor.process(0, *read())
            evicted += sum(result.evictions.values())
        if calls:
            sequencer = processor._cache[run][1]
            inline = len(orjson.dumps(sequencer.to_state())) + sum(
                len(orjson.dumps(c[2])) for c in sequencer.norm.pending)
        else:
            inline = 0
        seconds: list[float] = []
        sent: list[int] = []
        max_state = 0
        for j in range(small):
            sync.xadd(stream, entry(run, calls + j, small_line(j)).to_fields())
            ids, fields = read()
            before = net_in(sync)
            t0 = time.perf_counter()
            await processor.process(0, ids, fields)
            seconds.append(time.perf_counter() - t0)
            sent.append(net_in(sync) - before)
            max_state = max(max_state, sync.hstrlen(key, "s"))
        names = [f for f in sync.hkeys(key) if f.startswith(CALL_PREFIX)]
        call_bytes = sum(sync.hstrlen(key, f) for f in names)
        return Figures(calls, statistics.median(seconds) * 1e6, statistics.median(sent), max_state, len(names),
                       call_bytes, inline, evicted)
    finally:
        await client.aclose()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", default="0,5,10,20,40", help="numbers of large unanswered calls, comma separated")
    ap.add_argument("--input-kb", type=int, default=900, help="size of each call's input (KB)")
    ap.add_argument("--small", type=int, default=20, help="small lines measured after the calls")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    counts = [int(n) for n in args.calls.split(",")]
    server = start_redis()
    figures: dict[int, list[Figures]] = {n: [] for n in counts}
    try:
        for _ in range(args.rounds):
            for n in counts:  # interleaved: round after round over every N
                settings = Settings(redis_url=server.url, namespace=f"bench{uuid.uuid4().hex[:8]}", shards=1,
                                    redaction_enabled=False)
                sync = redis.Redis.from_url(server.url)
                figures[n].append(asyncio.run(measure(settings, sync, n, args.input_kb * 1000, args.small)))
                for key in sync.scan_iter(match=f"{settings.namespace}:*", count=1000):
                    sync.delete(key)
    finally:
        server.close()
    cap = Settings.model_fields["max_pending_tool_bytes"].default
    print(f"{args.input_kb} KB inputs, never answered; then {args.small} small lines, one batch each; "
          f"MAX_PENDING_TOOL_BYTES {cap:,}")
    print(f"{'N':>4} {'µs/line':>9} {'B to Redis/line':>16} {'state s':>8} {'call fields':>11} {'their bytes':>12} "
          f"{'evicted':>7} {'inline state, before':>21}")
    for n in counts:
        fs = figures[n]
        f = fs[-1]
        print(f"{n:>4} {statistics.median(x.us_per_line for x in fs):>9.0f} "
              f"{statistics.median(x.bytes_per_line for x in fs):>16,.0f} {f.max_state:>8,} {f.call_fields:>11} "
              f"{f.call_bytes:>12,} {f.evicted:>7} {f.inline_state:>21,}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
