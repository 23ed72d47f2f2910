"""How the worker's cost grows with the fleet: active runs, line size, worker count.

Three sweeps on a private ``redis-server``, each point in a namespace of its own:

- **active runs** (100, 1,000, 10,000, 100,000): the same number of lines, spread round-robin over
  that many runs that stay open for the whole measurement (no eof until the end), so every batch
  touches up to `batch size` distinct runs (beyond `RUN_CACHE_SIZE` runs, 16,384 by default, most
  of them are not in the worker's in-process cache);
- **line size** (200 B to 100 KB tool outputs, 100 active runs): tool request/response pairs whose
  output text has the given size;
- **workers** (1 to 4 worker processes, 1,000 active runs), which split the shards between them
  with shard leases (`--no-leases`: every worker reads every shard, as before leases). This
  machine has 2 cores shared by the workers and Redis, so more workers cannot add much here; the
  sweep shows whether they get in each other's way. Before the clock starts the workers have
  split the shards (every lease taken, none holding more than its share).

Each point: the first line of every run is published and processed before the clock starts (it
starts the run: a new state, a `started` record), so the timed lines are lines of runs that are
already active, as in a fleet where runs last hundreds of lines. Then the workers are stopped
(SIGSTOP), the timed lines are published, and the clock starts as the workers continue (SIGCONT).
Time = continue -> every shard's group has no lag and nothing pending. Reported: lines/s, the
ratio to the first point of the sweep, peak worker RSS (VmHWM, max over workers), Redis memory used
per active run after processing (run states and the active-run index: MEMORY USAGE of a sample of
state keys + the index, divided by runs).

Every sweep runs `--rounds` times (3), whole sweep after whole sweep, and a point's ratio is the
median of its ratios to the sweep's first point measured in the same round: the machine's speed
drifts by up to 2x between minutes, which a single pass carried into its ratios.

    python bench/scale.py [--lines 60000] [--rounds 3] [--sweep runs,size,workers] [--plot bench/results/scale.png]
    python bench/scale.py --sweep cache,batch,core   # what one cached run costs; the per-run work of a batch, and of the core

Targets (issue 13): throughput at 10,000 active runs >= 0.8 of that at 100; worker RSS bounded by a
setting (the run cache), not by the fleet; Redis memory per idle active run <= 4 KiB.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import itertools
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import redis

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from services.broker.embedded import free_port, start_redis  # noqa: E402
from services.settings import Settings  # noqa: E402

SHARDS = 4
GROUP = Settings.model_fields["group"].default


def _request(i: int) -> bytes:
    return json.dumps({"type": "message", "message": {
        "id": f"m{i}", "role": "assistant", "created": 1790431334,
        "content": [{"type": "toolRequest", "id": f"t{i}", "toolCall": {"status": "success", "value": {
            "name": "developer__shell", "arguments": {"command": f"pytest -q tests/test_{i % 50}.py"}}}}],
        "metadata": {"userVisible": True, "agentVisible": True}}}).encode()


def _response(i: int, size: int) -> bytes:
    text = ("ok " * (size // 3 + 1))[: max(size - 260, 1)]
    return json.dumps({"type": "message", "message": {
        "id": f"u{i}", "role": "user", "created": 1790431335,
        "content": [{"type": "toolResponse", "id": f"t{i}", "toolResult": {"status": "success", "value": {
            "content": [{"type": "text", "text": text}], "isError": False}}}],
        "metadata": {"userVisible": True, "agentVisible": True}}}).encode()


@dataclass
class Point:
    sweep: str
    x: int
    lines: int
    seconds: float
    lines_per_s: float
    worker_rss_mib: float
    redis_bytes_per_run: float


def _settings(url: str, ns: str) -> Settings:
    return Settings(redis_url=url, namespace=ns, shards=SHARDS)


def publish(client: redis.Redis, settings: Settings, names: list[str], seqs: list[int], lines: int,
            size: int) -> None:
    """`lines` tool lines round-robin over the runs `names` (a request then a response per run),
    continuing each run at `seqs` (updated)."""
    layout = settings.layout
    runs = len(names)
    streams = [layout.raw_stream(layout.shard_of(n)) for n in names]
    pipe = client.pipeline(transaction=False)
    ts = str(int(time.time() * 1000)).encode()
    for i in range(lines):
        r = i % runs
        seq = seqs[r]
        line = _request(seq // 2) if seq % 2 == 0 else _response(seq // 2, size)
        pipe.xadd(streams[r], {b"run": names[r], b"seq": str(seq), b"ts": ts, b"line": line, b"host": b"bench"})
        seqs[r] = seq + 1
        if len(pipe) >= 2000:
            pipe.execute()
    pipe.execute()


def _drained(client: redis.Redis, streams: list[str]) -> None:
    """Wait until every shard's group has no lag and nothing pending."""
    while True:
        done = True
        for stream in streams:
            for g in client.xinfo_groups(stream):
                if g["name"].decode() == GROUP and (g.get("lag") or g["pending"]):
                    done = False
        if done:
            return
        time.sleep(0.02)


def _leases_settled(client: redis.Redis, settings: Settings, workers: int, timeout: float = 60.0) -> None:
    """Wait until the workers have split the shards between them (services/worker/leases.py: a
    worker gives back shards above its share on its next renewal, every lease ttl / 3)."""
    deadline = time.monotonic() + timeout
    share = -(-SHARDS // workers)
    while time.monotonic() < deadline:
        owners = [client.get(settings.layout.shard_lease(s)) for s in range(SHARDS)]
        if all(owners) and max(owners.count(o) for o in owners) <= share:
            return
        time.sleep(0.2)
    raise SystemExit(f"the workers did not split the shards within {timeout:.0f} s")


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


# The workers' command line. `--gc-thresholds` runs them with other collector thresholds than the
# worker's own policy (services/worker/collector.py), to compare them.
WORKER_ARGV = ["-m", "services.cli", "worker"]


def worker_argv(gc_thresholds: str | None) -> list[str]:
    if not gc_thresholds:
        return WORKER_ARGV
    thresholds = tuple(int(t) for t in gc_thresholds.split(","))
    prelude = (f"import sys; from services.worker import collector; collector.GC_THRESHOLDS = {thresholds!r}; "
               "from services.cli import main; sys.exit(main())")
    return ["-c", prelude, "worker"]


def measure(url: str, sweep: str, x: int, runs: int, lines: int, size: int, workers: int, log: Path,
            profile: str | None = None, leases: bool = True, argv: list[str] = WORKER_ARGV) -> Point:
    ns = f"scale{uuid.uuid4().hex[:6]}"
    settings = _settings(url, ns)
    client = redis.Redis.from_url(url)
    names = [f"scale/{uuid.uuid4().hex[:8]}-{r:06d}" for r in range(runs)]
    seqs = [0] * runs
    # Warm-up, not timed: the first line of every run (it starts the run: a `started` record, a new
    # state), so that the timed lines are lines of runs that are already active.
    publish(client, settings, names, seqs, runs, size)
    for stream in settings.layout.raw_streams():
        client.xgroup_create(stream, GROUP, id="$", mkstream=True)
    ports = [free_port() for _ in range(workers)]
    env = {**os.environ, "GOOSE_INGEST_REDIS_URL": url, "GOOSE_INGEST_NAMESPACE": ns,
           "GOOSE_INGEST_SHARD_LEASES": "true" if leases else "false",
           "GOOSE_INGEST_SHARDS": str(SHARDS)}
    # --profile: the first worker runs under cProfile (stats written when it is terminated)
    prof = [[sys.executable, "-m", "cProfile", "-o", f"{profile}.{sweep.replace(' ', '-')}-{x}"]
            if profile and i == 0 else [sys.executable] for i in range(workers)]
    procs = [subprocess.Popen([*prof[i], *argv], cwd=REPO,
                              env={**env, "GOOSE_INGEST_METRICS_PORT": str(p)},
                              stdout=log.open("ab"), stderr=subprocess.STDOUT) for i, p in enumerate(ports)]
    try:
        deadline = time.monotonic() + 60
        while not all(_ready(p) for p in ports):
            if time.monotonic() > deadline:
                raise SystemExit(f"workers not ready within 60 s; see {log}")
            time.sleep(0.1)
        if leases:
            _leases_settled(client, settings, workers)
        streams = settings.layout.raw_streams()
        for stream in streams:
            client.execute_command("XGROUP", "SETID", stream, GROUP, "0")
        _drained(client, streams)
        # The timed lines are published while the workers are stopped (SIGSTOP), so the clock
        # starts with every line waiting and the publisher's cost is not in the figure.
        for p in procs:
            os.kill(p.pid, signal.SIGSTOP)
        try:
            publish(client, settings, names, seqs, lines, size)
        finally:
            started = time.perf_counter()
            for p in procs:
                os.kill(p.pid, signal.SIGCONT)
        _drained(client, streams)
        seconds = time.perf_counter() - started
        rss = max(_rss_mib(p.pid) for p in procs)
        sample = list(itertools.islice(client.scan_iter(match=f"{ns}:goose-ingest:run:*", count=1000), 1000))
        per_state = sum(client.memory_usage(k) or 0 for k in sample) / max(len(sample), 1)
        index = sum(client.memory_usage(k) or 0 for k in settings.layout.active_run_sets()) / max(runs, 1)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        for key in client.scan_iter(match=f"{ns}:*", count=5000):
            client.unlink(key)
        client.close()
    return Point(sweep, x, lines, seconds, lines / seconds, rss, per_state + index)


def cache_costs(counts: tuple[int, ...] = (4_096, 16_384)) -> None:
    """What one cached run costs the worker (in process, no Redis): its stored state's size, the
    time to encode and decode it, the Python heap it holds, and a full GC pass with the cache full
    (the run cache is the worker's largest set of long-lived objects)."""
    import tracemalloc

    import orjson

    from services.sequencer import Entry, RunSequencer

    settings = Settings()
    redactor = settings.redactor()
    seq = RunSequencer("scale/abcdef12-000001", redactor=redactor)
    for i in range(12):
        line = _request(i // 2) if i % 2 == 0 else _response(i // 2, 445)
        seq.accept(Entry(seq.run, i, 1_790_000_000_000 + i, "line", "stdout", line.decode(), None, "bench", None,
                         f"{i}-0"))
    state = orjson.dumps(seq.to_state(include_held=False))
    n = 20_000
    started = time.perf_counter()
    for _ in range(n):
        orjson.dumps(seq.to_state(include_held=False))
    encode = (time.perf_counter() - started) / n
    started = time.perf_counter()
    for _ in range(n):
        RunSequencer.from_state(orjson.loads(state), redactor=redactor, held={})
    decode = (time.perf_counter() - started) / n
    print(f"run state {len(state)} B; encode {encode * 1e6:.1f} us, decode {decode * 1e6:.1f} us per run")
    for count in counts:
        gc.collect()  # the garbage of the loops above is not the cache's
        tracemalloc.start()
        cache = [RunSequencer.from_state(orjson.loads(state), redactor=redactor, held={}) for _ in range(count)]
        held = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        started = time.perf_counter()
        gc.collect()
        pause = time.perf_counter() - started
        print(f"{count:>6} cached runs: {held / count:,.0f} B of Python heap per run, {held / 2**20:.1f} MiB; "
              f"a full GC pass {pause * 1000:.1f} ms")
        del cache


@contextlib.contextmanager
def worker_collector() -> Iterator[None]:
    """This process runs under the worker's collector policy (services/worker/collector.py) inside."""
    from services.worker.collector import tune_collector

    default = gc.get_threshold()
    tune_collector()
    try:
        yield
    finally:
        gc.set_threshold(*default)


def batch_costs(url: str, spreads: tuple[int, ...] = (25, 500), batches: int = 22) -> None:
    """The batch processor in process (no FastStream), on the private Redis: µs per line of
    `BatchProcessor.process` for batches of 500 lines spread over 25 runs (20 lines of each run)
    or over 500 runs (one line each), under the worker's collector policy. The difference is the
    per-run work of a batch. Each step of `process` is timed too (wrapped on the instance)."""
    import asyncio

    from services.broker.connect import async_client
    from services.streams.groups import ensure_groups
    from services.worker.processor import BatchProcessor

    def timed(steps: dict[str, float], name: str, fn: Any) -> Any:
        if asyncio.iscoroutinefunction(fn):
            async def wrapped_async(*args: Any) -> Any:
                started = time.perf_counter()
                try:
                    return await fn(*args)
                finally:
                    steps[name] = steps.get(name, 0.0) + time.perf_counter() - started
            return wrapped_async

        def wrapped(*args: Any) -> Any:
            started = time.perf_counter()
            try:
                return fn(*args)
            finally:
                steps[name] = steps.get(name, 0.0) + time.perf_counter() - started
        return wrapped

    async def one(spread: int) -> tuple[float, dict[str, float]]:
        settings = Settings(redis_url=url, namespace=f"scale{uuid.uuid4().hex[:6]}", shards=1,
                            run_cache_size=max(spread, 1))
        client = async_client(settings)
        sync = redis.Redis.from_url(url)
        stream = settings.layout.raw_stream(0)
        steps: dict[str, float] = {}
        try:
            await ensure_groups(client, settings)
            processor = BatchProcessor(settings, client)
            # the steps of `process`, in order: validate, sequencers, commit building, the commit
            # script's round trip (msgpack encoding included), settling the cache and the result
            processor._validate = timed(steps, "validate", processor._validate)  # type: ignore[method-assign]
            processor._feed = timed(steps, "sequencers", processor._feed)  # type: ignore[method-assign]
            processor._commit = timed(steps, "build commit", processor._commit)  # type: ignore[method-assign]
            processor.committer.commit = timed(steps, "commit", processor.committer.commit)  # type: ignore[method-assign]
            processor._settle = timed(steps, "settle", processor._settle)  # type: ignore[method-assign]
            seqs = [0] * spread
            names = [f"scale/{uuid.uuid4().hex[:8]}-{r:06d}" for r in range(spread)]
            elapsed, lines = 0.0, 0
            for b in range(batches):
                pipe = sync.pipeline(transaction=False)
                for i in range(500):
                    r = i % spread
                    seq = seqs[r]
                    seqs[r] += 1
                    line = _request(seq // 2) if seq % 2 == 0 else _response(seq // 2, 445)
                    pipe.xadd(stream, {b"run": names[r], b"seq": str(seq), b"ts": b"1790000000000", b"line": line,
                                       b"host": b"bench"})
                pipe.execute()
                reply = sync.xreadgroup(settings.group, "bench", {stream: ">"}, count=500)
                ids, fields = [i for i, _ in reply[0][1]], [f for _, f in reply[0][1]]
                if b == 2:  # the first batches start the runs (seq 0 takes the reference path)
                    steps.clear()
                started = time.perf_counter()
                await processor.process(0, ids, fields)
                if b >= 2:
                    elapsed += time.perf_counter() - started
                    lines += len(ids)
            return elapsed / lines, {name: t / lines for name, t in steps.items()}
        finally:
            await client.aclose()
            for key in sync.scan_iter(match=f"{settings.namespace}:*", count=5000):
                sync.unlink(key)
            sync.close()

    with worker_collector():
        for spread in spreads:
            cost, steps = asyncio.run(one(spread))
            print(f"batch of 500 lines over {spread:>3} runs: {cost * 1e6:5.1f} us per line in BatchProcessor.process "
                  f"({500 // spread} lines per run and batch): "
                  + ", ".join(f"{name} {t * 1e6:.1f}" for name, t in steps.items()))


def core_costs(rounds: int = 3) -> None:
    """The sequencer alone (normalizer and redaction included; no Redis, no batch processor), in
    process CPU time: µs per line when each call carries 20 lines of a run (25 runs), against one
    line per call over 500 and 10,000 runs, under the worker's collector policy. The difference is
    what one run costs per call in the core itself: the one-entry path and objects that are cold
    in the CPU's caches."""
    from services.normalizer import Limits
    from services.sequencer import Outcome, RunSequencer, parse_fields

    s = Settings()
    redactor, limits = s.redactor(), Limits(s.max_span_chars, s.max_pending_tools)

    def entry(run: str, seq: int) -> Any:
        line = _request(seq // 2) if seq % 2 == 0 else _response(seq // 2, 445)
        return parse_fields({b"run": run.encode(), b"seq": str(seq).encode(), b"ts": b"1790000000000",
                             b"line": line, b"host": b"bench"}, f"{1_790_000_000_000 + seq}-0")

    def per_line(runs: int, per_call: int, total: int) -> float:
        names = [f"scale/core-{r:06d}" for r in range(runs)]
        seqs = [RunSequencer(n, limits, s.max_buffered_entries, redactor, s.max_held_bytes) for n in names]
        for name, sequencer in zip(names, seqs, strict=True):  # seq 0 starts the run: not timed
            sequencer.accept_many([entry(name, 0)], Outcome())
        calls, nxt, n = [], [1] * runs, 0
        while n < total:
            for r in range(runs):
                calls.append((seqs[r], [entry(names[r], nxt[r] + k) for k in range(per_call)]))
                nxt[r] += per_call
                n += per_call
        started = time.process_time()
        for sequencer, entries in calls:
            sequencer.accept_many(entries, Outcome())
            sequencer.take_held_changes()
        return (time.process_time() - started) / n * 1e6

    shapes = ((25, 20, 20_000), (500, 1, 20_000), (10_000, 1, 40_000))
    results: dict[tuple[int, int], list[float]] = {}
    with worker_collector():
        for _ in range(rounds):
            for runs, per_call, total in shapes:
                results.setdefault((runs, per_call), []).append(per_line(runs, per_call, total))
    for (runs, per_call), costs in results.items():
        print(f"sequencer alone, {runs:>6} runs, {per_call:>2} lines per call: {statistics.median(costs):5.1f} us per "
              f"line (each round: {', '.join(f'{c:.1f}' for c in costs)})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lines", type=int, default=60_000, help="lines per point (the 100,000-run point uses 2 per run)")
    ap.add_argument("--sweep", default="runs,size,workers", help="any of runs,size,workers,cache (per cached run costs),batch (per run work of a batch),core (per run work in the sequencer alone)")
    ap.add_argument("--plot", default=str(REPO / "bench" / "results" / "scale.png"))
    ap.add_argument("--rounds", type=int, default=3, help="whole sweeps to run, one after the other (medians)")
    ap.add_argument("--json", default=None, help="also write the points as JSON here")
    ap.add_argument("--active-runs", default="100,1000,10000,100000", help="points of the active-runs sweep")
    ap.add_argument("--profile", metavar="PREFIX", help="run the first worker of each point under cProfile")
    ap.add_argument("--workers", default="1,2,3,4", help="points of the workers sweep")
    ap.add_argument("--no-leases", action="store_true",
                    help="workers sweep without shard leases (every worker reads every shard), for comparison")
    ap.add_argument("--gc-thresholds", metavar="G0,G1,G2",
                    help="run the workers with these collector thresholds instead of their own policy")
    ap.add_argument("--log", help="append the workers' output here (default: a temporary file)")
    args = ap.parse_args()
    if args.profile and args.gc_thresholds:
        raise SystemExit("scale.py: --profile and --gc-thresholds do not combine")
    argv = worker_argv(args.gc_thresholds)
    random.seed(7)
    sweeps = args.sweep.split(",")
    points: list[Point] = []
    with tempfile.TemporaryDirectory() as tmp:
        server = start_redis(dir=str(Path(tmp) / "redis"))
        log = Path(args.log) if args.log else Path(tmp) / "workers.log"
        try:
            if "cache" in sweeps:
                cache_costs()
            if "core" in sweeps:
                core_costs()
            if "batch" in sweeps:
                for _ in range(2):  # twice, interleaved: the machine's speed drifts
                    batch_costs(server.url)
            for _ in range(args.rounds):  # whole sweeps, one after the other: the machine's speed drifts
                if "runs" in sweeps:
                    for runs in (int(r) for r in args.active_runs.split(",")):
                        points.append(measure(server.url, "active runs", runs, runs, max(args.lines, 2 * runs),
                                              445, 1, log, args.profile, argv=argv))
                if "size" in sweeps:
                    for size in (200, 2_000, 20_000, 100_000):
                        lines = max(2_000, min(args.lines, args.lines * 445 // size))
                        points.append(measure(server.url, "line bytes", size, 100, lines, size, 1, log, argv=argv))
                if "workers" in sweeps:
                    for workers in (int(w) for w in args.workers.split(",")):
                        points.append(measure(server.url, "workers, no leases" if args.no_leases else "workers",
                                              workers, 1_000, args.lines, 445, workers, log,
                                              leases=not args.no_leases, argv=argv))
        finally:
            server.close()
    if not points:
        return
    from services.native import core_kind
    from services.worker.collector import GC_THRESHOLDS

    print(f"workers' core: {core_kind()} (GOOSE_INGEST_PURE_PYTHON=1: the Python one); collector thresholds: "
          f"{args.gc_thresholds or ','.join(map(str, GC_THRESHOLDS))}")
    rows = combine(points, args.rounds)
    print(f"rounds: {args.rounds}; lines/s and Redis B/run: medians; ratio: the median over rounds of the point "
          "against the sweep's first point of the same round (each round: the ratios); RSS: the highest")
    print(f"{'sweep':<12} {'x':>7} {'lines':>7} {'lines/s':>9} {'ratio':>6} {'RSS MiB':>8} {'Redis B/run':>11}"
          "  each round")
    for r in rows:
        print(f"{r.sweep:<12} {r.x:>7} {r.lines:>7} {r.lines_per_s:>9.0f} {r.ratio:>6.2f} "
              f"{r.worker_rss_mib:>8.1f} {r.redis_bytes_per_run:>11.0f}  {', '.join(f'{x:.2f}' for x in r.ratios)}")
    if args.json:
        Path(args.json).write_text(json.dumps({"points": [asdict(p) for p in points],
                                               "rows": [asdict(r) for r in rows]}, indent=1))
    if args.plot:
        _plot(rows, Path(args.plot))


@dataclass
class Row:
    """One point of a sweep over all rounds."""

    sweep: str
    x: int
    lines: int
    lines_per_s: float  # median
    ratio: float  # median of `ratios`
    ratios: list[float]  # against the sweep's first point, in the same round
    worker_rss_mib: float  # highest
    redis_bytes_per_run: float  # median


def combine(points: list[Point], rounds: int) -> list[Row]:
    """Points in measuring order (`rounds` whole sweeps) -> one row per (sweep, x)."""
    per_round = len(points) // rounds
    by_key: dict[tuple[str, int], list[Point]] = {}
    ratios: dict[tuple[str, int], list[float]] = {}
    for r in range(rounds):
        first: dict[str, float] = {}
        for p in points[r * per_round:(r + 1) * per_round]:
            base = first.setdefault(p.sweep, p.lines_per_s)
            by_key.setdefault((p.sweep, p.x), []).append(p)
            ratios.setdefault((p.sweep, p.x), []).append(p.lines_per_s / base)
    return [Row(sweep, x, pts[0].lines, statistics.median(p.lines_per_s for p in pts),
                statistics.median(ratios[(sweep, x)]), ratios[(sweep, x)], max(p.worker_rss_mib for p in pts),
                statistics.median(p.redis_bytes_per_run for p in pts))
            for (sweep, x), pts in by_key.items()]


def _plot(table: list[Row], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[bench]'): no plot", file=sys.stderr)
        return
    sweeps = list(dict.fromkeys(p.sweep for p in table))
    # One row per measure: Redis bytes per run (~1 KiB) drawn on the RSS axis (~100 MiB) was a flat line.
    fig, axes = plt.subplots(3, len(sweeps), figsize=(5 * len(sweeps), 10), squeeze=False)
    for col, sweep in enumerate(sweeps):
        pts = [p for p in table if p.sweep == sweep]
        xs = [p.x for p in pts]
        rows = ((f"worker lines/s vs {sweep}", [p.lines_per_s for p in pts]),
                ("worker peak RSS, MiB", [p.worker_rss_mib for p in pts]),
                ("Redis bytes per active run", [p.redis_bytes_per_run for p in pts]))
        for row, (title, ys) in enumerate(rows):
            ax = axes[row][col]
            ax.plot(xs, ys, marker="o")
            ax.set_title(title)
            ax.set_ylim(bottom=0)
            if not sweep.startswith("workers"):
                ax.set_xscale("log")
        axes[2][col].set_xlabel(sweep)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    print(f"plot: {path}")


if __name__ == "__main__":
    main()
