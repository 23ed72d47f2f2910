"""OTLP exporter benchmark: spans/s of one `export otlp` process against a floor, same run.

- **exporter**: topic entries for RUNS runs (TOOLS tool events, one agent event and the
  started/ended records each) are written first, then the exporter's consumer group is created at
  `$` so nothing is delivered; one real `python -m services.cli export otlp` process starts and
  reports ready; then ``XGROUP SETID ... 0`` opens the gate. Time = gate opened -> every span
  (tool spans + one root per run) counted by the receiver and the group has nothing pending.
- **floor**: the same spans, pre-built by the same mapping (not timed), exported by the SDK's
  `OTLPSpanExporter` in batches of GOOSE_INGEST_BATCH_SIZE in a plain loop from this process.

Both send to the same local OTLP/HTTP receiver (a separate process that decodes every request
with opentelemetry-proto and counts spans: tests/support/otlp_receiver.py). Variants are
interleaved (floor, exporter, floor, exporter, ...) because the CPU speed here drifts; the ratio
is exporter / floor of the medians.

    python bench/otlp_export.py [--runs 200] [--tools 50] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

import redis

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # noqa: E402

from contracts.topics import TopicEntry  # noqa: E402
from services.broker.embedded import start_redis  # noqa: E402
from services.export.otlp import mapping as m  # noqa: E402
from services.settings import Settings  # noqa: E402
from tests.support.phoenix_server import free_port  # noqa: E402

SHARDS = 4
BATCH = Settings.model_fields["batch_size"].default
GROUP = Settings.model_fields["otlp_group"].default
BASE_S = 1_764_000_000
FINISH_TIMEOUT_S = 300


def ts(sec: float) -> str:
    whole = int(sec)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)) + f".{int((sec - whole) * 1000):03d}Z"


def build(runs: int, tools: int) -> tuple[list[dict], list[dict]]:
    events, records = [], []
    for i in range(runs):
        run = f"bench/{i}"
        t0 = BASE_S + i
        evs = [{"eventId": f"{run}:0", "runId": run, "seq": 0, "type": "agent", "timestamp": ts(t0), "lines": [0, 0],
                "message": "Looking at the code."}]
        for s in range(1, tools + 1):
            if s % 2:
                body = {"type": "command", "command": f"pytest -q tests/test_{s}.py", "exitCode": 0, "isSuccess": True}
            else:
                body = {"type": "read", "path": f"/src/module_{s}.py", "startLine": 1, "endLine": 40, "isSuccess": True}
            evs.append({"eventId": f"{run}:{s}", "runId": run, "seq": s, "timestamp": ts(t0 + s * 0.01), "lines": [s, s],
                        "tool": "developer__shell" if s % 2 else "developer__text_editor", "toolCallId": f"toolu_{i}_{s}",
                        "durationMs": 7, **body})
        counts = {"agent": 1, "command": (tools + 1) // 2, "read": tools // 2}
        records += [
            {"recordId": f"{run}:run:0", "runId": run, "seq": 0, "state": "started", "timestamp": ts(t0), "counts": {},
             "host": "bench", "agent": "goose/bench"},
            {"recordId": f"{run}:run:1", "runId": run, "seq": tools + 1, "state": "ended", "timestamp": ts(t0 + 1),
             "counts": counts, "exitCode": 0, "inputTokens": 1000, "outputTokens": 100, "host": "bench", "agent": "goose/bench"},
        ]
        events += evs
    return events, records


def received(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/count", timeout=5) as resp:
        return int(resp.read())


def floor(events: list[dict], records: list[dict], port: int) -> float:
    cfg = m.MappingConfig()
    spans = [m.tool_span(e, cfg, m.Tally()) for e in events if m.is_tool_span(e)]
    by_run: dict[str, list[dict]] = {}
    for rec in records:
        by_run.setdefault(rec["runId"], []).append(rec)
    spans += [m.root_span(m.fold_records(run, recs), [], cfg, m.Tally()) for run, recs in by_run.items()]
    exporter = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces")
    before = received(port)
    started = time.perf_counter()
    for i in range(0, len(spans), BATCH):
        exporter.export(spans[i: i + BATCH])
    elapsed = time.perf_counter() - started
    exporter.shutdown()
    assert received(port) - before == len(spans)
    return len(spans) / elapsed


def exporter_run(url: str, events: list[dict], records: list[dict], port: int, expected: int, workdir: Path) -> float:
    ns = f"b{uuid.uuid4().hex[:8]}"
    s = Settings(redis_url=url, namespace=ns, shards=SHARDS)
    r = redis.Redis.from_url(url)
    streams = s.layout.events_partitions() + s.layout.runs_partitions()
    pipe = r.pipeline(transaction=False)
    for e in events:
        pipe.xadd(s.layout.events_partition(0), TopicEntry.of_event(e).to_fields())
    for rec in records:
        pipe.xadd(s.layout.runs_partition(0), TopicEntry.of_record(rec).to_fields())
    pipe.execute()
    # The gate: the group exists *after* the entries, at `$`, so the exporter sees nothing until SETID 0.
    for stream in streams:
        r.xgroup_create(stream, GROUP, id="$")
    mport = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GOOSE_INGEST_", "OTEL_"))}
    env.update({"GOOSE_INGEST_REDIS_URL": url, "GOOSE_INGEST_NAMESPACE": ns, "GOOSE_INGEST_SHARDS": str(SHARDS),
                "GOOSE_INGEST_METRICS_PORT": str(mport), "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"http://127.0.0.1:{port}/v1/traces"})
    log = (workdir / f"exporter-{ns}.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "services.cli", "export", "otlp", "--log-level", "WARNING"],
                            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{mport}/readyz", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit(f"exporter did not become ready; see {log.name}")
            time.sleep(0.1)
        before = received(port)
        started = time.perf_counter()
        for stream in streams:
            r.xgroup_setid(stream, GROUP, "0")
        while True:
            if received(port) - before >= expected:
                if all(g["pending"] == 0 for st in streams for g in r.xinfo_groups(st) if g["name"] == GROUP.encode()):
                    break
            if time.perf_counter() - started > FINISH_TIMEOUT_S:
                log.flush()
                tail = (workdir / f"exporter-{ns}.log").read_text(errors="replace")[-3000:]
                groups = [g for st in streams for g in r.xinfo_groups(st)]
                dead = [f for st in s.layout.export_deadletter_partitions("otlp") for _, f in r.xrange(st)]
                still_open = [r.zrange(k, 0, -1) for k in s.layout.export_open_run_sets("otlp")]
                groups.append({"dead_letters": dead, "open_runs": still_open})
                raise SystemExit(f"exporter did not finish in {FINISH_TIMEOUT_S} s: received "
                                 f"{received(port) - before}/{expected}, groups {groups}\n{tail}")
            time.sleep(0.01)
        elapsed = time.perf_counter() - started
        got = received(port) - before
        assert got == expected, f"the receiver got {got} spans, expected exactly {expected}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        for key in r.scan_iter(f"{ns}:*"):
            r.delete(key)
        r.close()
    return expected / elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--tools", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    events, records = build(args.runs, args.tools)
    expected = args.runs * (args.tools + 1)  # tool spans + one root per run
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        server = start_redis(dir=str(workdir / "redis"))
        port = free_port()
        rx = subprocess.Popen([sys.executable, "-m", "tests.support.otlp_receiver", str(port)], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        rx.stdout.readline()  # serving
        try:
            floors, exporters = [], []
            for _ in range(args.rounds):
                floors.append(floor(events, records, port))
                print(f"floor    (SDK exporter, pre-built spans): {floors[-1]:9.0f} spans/s", flush=True)
                exporters.append(exporter_run(server.url, events, records, port, expected, workdir))
                print(f"exporter (one `export otlp` process)    : {exporters[-1]:9.0f} spans/s", flush=True)
            ratio = statistics.median(exporters) / statistics.median(floors)
            print(f"{expected} spans per variant; ratio exporter/floor (medians): {ratio:.2f}")
        finally:
            rx.terminate()
            rx.wait(timeout=10)
            server.close()


if __name__ == "__main__":
    main()
