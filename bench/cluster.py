"""Redis Cluster benchmark: the worker on one node vs on a cluster, the commit's cost, the price of
`REDIS_WAIT_REPLICAS`, and Redis memory per active run and per retained raw line. Same run,
variants interleaved (the CPU speed of these machines drifts), each against its own floor.

Starts its own servers: one `redis-server` (single node, 4 shards), a local cluster of 3
primaries + 3 replicas (16 shards) and one of 3 primaries without replicas (16 shards, to tell
the cluster's own cost from the replication feed), all without persistence.

1. **Worker throughput** (backlog mode, one real `goose-ingest worker` process): the raw entries
   of many runs are published first with the consumer groups at `$` (the worker sees nothing),
   then `XGROUP SETID 0` opens the gate; time = gate -> every run's `ended` record. Lines/s.
   The floor of each mode: a plain redis-py loop on the same broker (XREADGROUP 500, one XADD
   per entry + XACK in one pipeline, no parsing), so "worker / floor" compares like with like.
2. **The commit's cost** on the broker: `INFO commandstats` of EVALSHA (usec per call) and Redis
   CPU (used_cpu_user+sys) per processed line, summed over every node of the mode. The second
   says how many lines/s one Redis core (one primary) sustains: 1e6 / (CPU µs per line).
3. **WAIT** (cluster): a tap's `xadd_batch` of 256-entry batches with 0 vs 1 replica(s) to wait
   for; ratio of lines/s.
4. **Memory**: `MEMORY USAGE` of the run states of runs stopped half way (active runs), and the
   `used_memory` growth per raw entry published (retained raw line, ~445-byte goose lines).

    python bench/cluster.py [--lines 20000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from contracts.topics import RECORD, TopicEntry  # noqa: E402
from services.broker.cluster import xadd_batch  # noqa: E402
from services.broker.connect import sync_client  # noqa: E402
from services.broker.embedded import start_redis  # noqa: E402
from services.settings import Settings  # noqa: E402
from tests.support.fixtures import TRANSCRIPTS  # noqa: E402
from tests.support.redis_cluster import start_cluster  # noqa: E402

BATCH = 500
PUBLISH_BATCH = 256


def with_namespace(settings: Settings, ns: str) -> Settings:
    # Not model_copy(update=...): it would keep the cached `layout` of the old namespace.
    return Settings(redis_url=settings.redis_url, redis_cluster=settings.redis_cluster, shards=settings.shards,
                    namespace=ns)


def corpus(total_lines: int, tag: str) -> dict[str, list[bytes]]:
    """The goose transcripts repeated under distinct run keys until `total_lines` lines."""
    lines = [p.read_bytes().splitlines() for p in TRANSCRIPTS if not p.name.startswith("x-")]
    runs: dict[str, list[bytes]] = {}
    n = i = 0
    while n < total_lines:
        body = lines[i % len(lines)]
        runs[f"bench/{tag}/{i}"] = body
        n += len(body)
        i += 1
    return runs


def entry(run: str, seq: int, line: bytes | None) -> dict[bytes, Any]:
    fields: dict[bytes, Any] = {b"run": run, b"seq": str(seq), b"ts": str(int(time.time() * 1000)),
                                b"host": b"bench", b"agent": b"goose/bench"}
    if line is None:
        fields[b"kind"] = b"eof"
        fields[b"exit"] = b"0"
    else:
        fields[b"kind"] = b"line"
        fields[b"stream"] = b"stdout"
        fields[b"line"] = line
    return fields


def publish(settings: Settings, runs: dict[str, list[bytes]], eof: bool = True) -> None:
    r = sync_client(settings)
    layout = settings.layout
    by_stream: dict[str, list[dict]] = {}
    for run, lines in runs.items():
        stream = layout.raw_stream(layout.shard_of(run))
        items = by_stream.setdefault(stream, [])
        items += [entry(run, i, line) for i, line in enumerate(lines)]
        if eof:
            items.append(entry(run, len(lines), None))
    for stream, items in by_stream.items():
        for i in range(0, len(items), 1000):
            xadd_batch(r, stream, items[i:i + 1000])


def gate_groups(settings: Settings, at: str) -> None:
    r = sync_client(settings)
    for stream in settings.layout.raw_streams():
        if at == "$":
            r.xgroup_create(stream, settings.group, id="$", mkstream=True)
        else:
            r.xgroup_setid(stream, settings.group, id=at)


def ended(settings: Settings) -> int:
    r = sync_client(settings)
    n = 0
    for p in settings.layout.runs_partitions():
        n += sum(1 for _, f in r.xrange(p) if TopicEntry.from_fields(f, RECORD).label in ("ended", "abandoned"))
    return n


def node_clients(settings: Settings) -> list[Any]:
    import redis

    r = sync_client(settings)
    if settings.redis_cluster:
        return [n.redis_connection for n in r.get_primaries()]
    return [redis.Redis.from_url(settings.redis_url)]


def broker_cpu_us(settings: Settings) -> float:
    total = 0.0
    for c in node_clients(settings):
        info = c.info("cpu")
        total += (float(info["used_cpu_user"]) + float(info["used_cpu_sys"])) * 1e6
    return total


def evalsha_stats(settings: Settings) -> tuple[int, float]:
    calls, usec = 0, 0.0
    for c in node_clients(settings):
        stat = c.info("commandstats").get("cmdstat_evalsha")
        if stat:
            calls += int(stat["calls"])
            usec += float(stat["usec"])
    return calls, usec


def reset_stats(settings: Settings) -> None:
    for c in node_clients(settings):
        c.config_resetstat()


def worker_run(settings: Settings, lines: int, log: Path) -> dict[str, float]:
    ns = f"b{uuid.uuid4().hex[:8]}"
    s = with_namespace(settings, ns)
    runs = corpus(lines, ns)
    publish(s, runs)
    gate_groups(s, "$")  # after publishing: on an empty stream `$` is 0-0 and would let everything through
    total_lines = sum(len(v) for v in runs.values())
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("GOOSE_INGEST_") or k == "GOOSE_INGEST_PURE_PYTHON"}
    env.update({"GOOSE_INGEST_REDIS_URL": s.redis_url or "", "GOOSE_INGEST_NAMESPACE": ns,
                "GOOSE_INGEST_SHARDS": str(s.shards), "GOOSE_INGEST_METRICS_PORT": "0",
                "GOOSE_INGEST_BATCH_SIZE": str(BATCH)})
    if s.redis_cluster:
        env["GOOSE_INGEST_REDIS_CLUSTER"] = "true"
    proc = subprocess.Popen([sys.executable, "-m", "services.cli", "worker"], cwd=REPO, env=env,
                            stdout=log.open("ab"), stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while b"consuming" not in log.read_bytes():
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"worker did not start: {log.read_text()[-2000:]}")
            time.sleep(0.05)
        time.sleep(0.5)
        if ended(s):
            raise RuntimeError("the worker processed entries before the gate opened")
        reset_stats(s)
        cpu0 = broker_cpu_us(s)
        t0 = time.perf_counter()
        gate_groups(s, "0")
        while ended(s) < len(runs):
            if time.perf_counter() - t0 > 600:
                raise RuntimeError("worker did not finish")
            time.sleep(0.05)
        elapsed = time.perf_counter() - t0
        cpu = broker_cpu_us(s) - cpu0
        calls, usec = evalsha_stats(s)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        wipe(s)
    return {"lines_s": total_lines / elapsed, "cpu_us_line": cpu / total_lines,
            "commit_us": usec / calls if calls else float("nan"), "lines_commit": total_lines / max(calls, 1)}


def floor_run(settings: Settings, lines: int) -> float:
    """Plain redis-py: XREADGROUP 500 + one XADD per entry + XACK, one pipeline, no parsing."""
    ns = f"f{uuid.uuid4().hex[:8]}"
    s = with_namespace(settings, ns)
    runs = corpus(lines, ns)
    gate_groups(s, "$")
    publish(s, runs)
    gate_groups(s, "0")
    r = sync_client(s)
    layout = s.layout
    total = 0
    t0 = time.perf_counter()
    for shard in range(layout.shards):
        stream, out = layout.raw_stream(shard), layout.events_partition(shard)
        while True:
            reply = r.xreadgroup(s.group, "floor", {stream: ">"}, count=BATCH)
            if not reply or not reply[0][1]:
                break
            entries = reply[0][1]
            pipe = r.pipeline(transaction=False)
            for _sid, fields in entries:
                pipe.xadd(out, {b"data": fields.get(b"line", b"")})
            pipe.xack(stream, s.group, *[sid for sid, _ in entries])
            pipe.execute()
            total += sum(1 for _, f in entries if f.get(b"kind") == b"line")
    elapsed = time.perf_counter() - t0
    wipe(s)
    return total / elapsed


def wait_run(settings: Settings, lines: int, replicas: int) -> float:
    ns = f"w{uuid.uuid4().hex[:8]}"
    s = with_namespace(settings, ns)
    r = sync_client(s)
    body = [entry(f"bench/{ns}/0", i, line) for i, line in enumerate(
        (TRANSCRIPTS[0].read_bytes().splitlines() * (lines // 10 + 1))[:lines])]
    stream = s.layout.raw_stream(0)
    t0 = time.perf_counter()
    for i in range(0, len(body), PUBLISH_BATCH):
        xadd_batch(r, stream, body[i:i + PUBLISH_BATCH], replicas, 1000)
    elapsed = time.perf_counter() - t0
    wipe(s)
    return len(body) / elapsed


def memory(settings: Settings, log: Path) -> dict[str, float]:
    """Bytes per retained raw line, and per active run (state hash) half way through its transcript."""
    ns = f"m{uuid.uuid4().hex[:8]}"
    s = with_namespace(settings, ns)
    clients = node_clients(s)
    runs = {f"bench/{ns}/{i}": TRANSCRIPTS[i % 4].read_bytes().splitlines() for i in range(400)}
    half = {run: lines[: len(lines) // 2] for run, lines in runs.items()}
    used0 = sum(int(c.info("memory")["used_memory"]) for c in clients)
    publish(s, half, eof=False)
    gate_groups(s, "$")
    used1 = sum(int(c.info("memory")["used_memory"]) for c in clients)
    raw_lines = sum(len(v) for v in half.values())
    raw_bytes = sum(len(line) for v in half.values() for line in v)
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("GOOSE_INGEST_") or k == "GOOSE_INGEST_PURE_PYTHON"}
    env.update({"GOOSE_INGEST_REDIS_URL": s.redis_url or "", "GOOSE_INGEST_NAMESPACE": ns,
                "GOOSE_INGEST_SHARDS": str(s.shards), "GOOSE_INGEST_METRICS_PORT": "0"})
    if s.redis_cluster:
        env["GOOSE_INGEST_REDIS_CLUSTER"] = "true"
    gate_groups(s, "0")
    proc = subprocess.Popen([sys.executable, "-m", "services.cli", "worker"], cwd=REPO, env=env,
                            stdout=log.open("ab"), stderr=subprocess.STDOUT)
    r = sync_client(s)
    try:
        deadline = time.monotonic() + 120
        while sum(r.xpending(x, s.group)["pending"] + (_lag(r, x, s.group)) for x in s.layout.raw_streams()):
            if time.monotonic() > deadline:
                raise RuntimeError("worker did not catch up")
            time.sleep(0.2)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    state_bytes = [int(r.memory_usage(s.layout.run_state(run)) or 0) for run in runs]
    zset_bytes = sum(int(r.memory_usage(k) or 0) for k in s.layout.active_run_sets())
    wipe(s)
    return {"raw_line_bytes": (used1 - used0) / raw_lines, "raw_payload_bytes": raw_bytes / raw_lines,
            "state_median": statistics.median(state_bytes), "state_max": max(state_bytes),
            "active_index_per_run": zset_bytes / len(runs)}


def _lag(r: Any, stream: str, group: str) -> int:
    for g in r.xinfo_groups(stream):
        if g["name"].decode() == group:
            return int(g.get("lag") or 0)
    return 0


def wipe(settings: Settings) -> None:
    for c in node_clients(settings):
        for key in c.scan_iter(match=f"{settings.namespace}:*", count=1000):
            c.unlink(key)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lines", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    single = start_redis(dir=str(tmp / "single"))
    cluster = start_cluster(str(tmp / "cluster"))
    bare = start_cluster(str(tmp / "bare"), replicas=0)  # separates the replication feed from the cluster's own cost
    log = tmp / "worker.log"
    try:
        modes = {
            "single": Settings(redis_url=single.url, shards=4),
            "cluster": Settings(redis_url=cluster.url, redis_cluster=True),
            "cluster-no-replicas": Settings(redis_url=bare.url, redis_cluster=True),
        }
        results: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
        floors: dict[str, list[float]] = {m: [] for m in modes}
        waits: dict[int, list[float]] = {0: [], 1: []}
        for rnd in range(args.rounds):
            for mode, s in modes.items():
                floors[mode].append(floor_run(s, args.lines))
                results[mode].append(worker_run(s, args.lines, log))
            for replicas in (0, 1) if rnd % 2 == 0 else (1, 0):
                waits[replicas].append(wait_run(modes["cluster"], args.lines, replicas))
        med = statistics.median
        print(f"# bench/cluster.py: {args.lines} lines per variant, {args.rounds} rounds, medians")
        print("mode                shards  worker lines/s  floor lines/s  worker/floor  redis CPU us/line  "
              "lines/s per Redis core  commit us  lines/commit")
        for mode, s in modes.items():
            rs = results[mode]
            lines_s, floor = med(r["lines_s"] for r in rs), med(floors[mode])
            cpu = med(r["cpu_us_line"] for r in rs)
            print(f"{mode:19} {s.shards:6}  {lines_s:14.0f}  {floor:13.0f}  {lines_s / floor:12.2f}  {cpu:17.2f}  "
                  f"{1e6 / cpu:22.0f}  {med(r['commit_us'] for r in rs):9.0f}  "
                  f"{med(r['lines_commit'] for r in rs):12.1f}")
        c_s = med(r["lines_s"] for r in results["cluster"]) / med(r["lines_s"] for r in results["single"])
        c_c = med(r["cpu_us_line"] for r in results["cluster"]) / med(r["cpu_us_line"] for r in results["single"])
        print(f"cluster/single: worker lines/s {c_s:.2f}, Redis CPU per line {c_c:.2f}")
        b_s = med(r["lines_s"] for r in results["cluster-no-replicas"]) / med(r["lines_s"] for r in results["single"])
        b_c = med(r["cpu_us_line"] for r in results["cluster-no-replicas"]) / med(
            r["cpu_us_line"] for r in results["single"])
        print(f"cluster-no-replicas/single: worker lines/s {b_s:.2f}, Redis CPU per line {b_c:.2f}")
        w0, w1 = med(waits[0]), med(waits[1])
        print(f"tap publish (cluster, {PUBLISH_BATCH}-entry batches): WAIT 0 {w0:.0f} lines/s, WAIT 1 {w1:.0f} "
              f"lines/s, ratio {w1 / w0:.2f}")
        for mode, s in list(modes.items())[:2]:
            m = memory(s, log)
            print(f"memory ({mode}): {m['raw_line_bytes']:.0f} B per retained raw line "
                  f"(payload {m['raw_payload_bytes']:.0f} B); active run state median {m['state_median']:.0f} B, "
                  f"max {m['state_max']:.0f} B; active-run index {m['active_index_per_run']:.0f} B per run")
    finally:
        single.close()
        cluster.stop()
        bare.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
