"""Hostile bodies against one gateway process: does /healthz and a well-behaved tap stay answered? (issue 34, item 2)

For each bomb, a fresh `goose-ingest gateway` (default limits: 16 MiB bodies) on a private redis-server;
``--hostile`` connections post the bomb with a valid token in a closed loop for ``--seconds``, while a
prober asks ``/healthz`` every 50 ms and a well-behaved tap (another token) posts a one-entry batch
every 100 ms. Reported per bomb: the worst and p99 latency of both, their ratio to the control (the
same run with no hostile traffic), how the hostile requests were answered (status: count, and their
median time), and the gateway's peak RSS (VmHWM) against the chart's memory limit (384 MiB).

    python bench/gateway_bombs.py [--seconds 5] [--hostile 4] [--only gzip-members,...]

Bombs (each at or near the 16 MiB body limit):
- ``gzip-empty-objects``: gzip of ``{}\\n`` x 16 MiB (16 KB sent; 5.6 M entries decoded before issue 34);
- ``ndjson-empty-objects``: the same uncompressed (16 MiB sent);
- ``json-array``: ``[{},{},...]`` 16 MiB;
- ``nested-line``: one NDJSON line ``{"a":[[],[],...]}`` of 16 MiB (5.6 M lists if it were parsed);
- ``gzip-members``: 4 MiB of empty gzip members (~200,000);
- ``zstd-frames``: 1 MiB of empty zstd frames (~110,000);
- ``gzip-zeros``: gzip of 256 MiB of zeros (a classic inflation bomb).
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import importlib.util
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from uuid import uuid4

import orjson
import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from services.broker.embedded import start_redis  # noqa: E402
from services.gateway import tokens  # noqa: E402
from services.settings import Settings  # noqa: E402

_spec = importlib.util.spec_from_file_location("bench_gateway", ROOT / "bench" / "gateway.py")
assert _spec is not None and _spec.loader is not None
bench_gateway = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_gateway)

LIMIT = Settings.model_fields["gateway_max_body_bytes"].default  # the bombs are sized at the default body limit


def chart_memory_limit_mib() -> int:
    """The gateway's memory limit in the chart (helm/goose-ingest/values.yaml): what a replica must stay under."""
    import yaml

    values = yaml.safe_load((ROOT / "helm" / "goose-ingest" / "values.yaml").read_text())
    limit = str(values["gateway"]["resources"]["limits"]["memory"])
    if not limit.endswith("Mi"):
        raise SystemExit(f"the chart's gateway memory limit {limit!r} is not in Mi")
    return int(limit[:-2])


MEMORY_LIMIT_MIB = chart_memory_limit_mib()
SAID: dict[int, bytes] = {}  # the first reply of each 5xx status, to tell why


def bombs() -> dict[str, tuple[bytes, str]]:
    import zstandard

    empty_gzip = gzip.compress(b"", 9)
    empty_zstd = zstandard.ZstdCompressor().compress(b"")
    objects = b"{}\n" * (LIMIT // 3)
    return {
        "gzip-empty-objects": (gzip.compress(objects, 9), "gzip"),
        "ndjson-empty-objects": (objects, ""),
        "json-array": (b"[" + b"{}," * (LIMIT // 3 - 1) + b"{}]", ""),
        "nested-line": (b'{"a":[' + b"[]," * (LIMIT // 3 - 4) + b"[]]}\n", ""),
        "gzip-members": (empty_gzip * ((4 << 20) // len(empty_gzip)), "gzip"),
        "zstd-frames": (empty_zstd * ((1 << 20) // len(empty_zstd)), "zstd"),
        "gzip-zeros": (gzip.compress(b"\0" * (256 << 20), 9), "gzip"),
    }


def post(host: str, port: int, body: bytes, token: str, encoding: str, timeout: float = 300,
         conn: list[http.client.HTTPConnection] | None = None) -> tuple[int, float]:
    """One POST; on ``conn`` (a list holding the kept-alive connection, or empty) when given."""
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/x-ndjson"}
    if encoding:
        headers["Content-Encoding"] = encoding
    started = time.perf_counter()
    keep = conn if conn is not None else []
    if not keep:
        keep.append(http.client.HTTPConnection(host, port, timeout=timeout))
    c = keep[0]
    try:
        c.request("POST", "/v1/raw", body=body, headers=headers)
        resp = c.getresponse()
        reply = resp.read()
        if resp.status >= 500:
            SAID.setdefault(resp.status, reply[:200])
        if resp.will_close or conn is None:
            c.close()
            keep.clear()
        return resp.status, time.perf_counter() - started
    except (OSError, http.client.HTTPException):
        c.close()
        keep.clear()
        return 0, time.perf_counter() - started


def get(host: str, port: int, path: str) -> tuple[int, float]:
    started = time.perf_counter()
    conn = http.client.HTTPConnection(host, port, timeout=60)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        resp.read()
        return resp.status, time.perf_counter() - started
    except OSError:
        return 0, time.perf_counter() - started
    finally:
        conn.close()


def vm_hwm_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def one(name: str, bomb: tuple[bytes, str] | None, settings: Settings, tmp: Path, hostile_token: str, good_token: str,
        seconds: float, hostile: int, root: Path) -> dict:
    proc, url = bench_gateway.start_gateway(settings, tmp, f"gw-{name}", root=root,
                                            GOOSE_INGEST_GATEWAY_RATE_LINES_PER_S=str(settings.gateway_rate_lines_per_s),
                                            GOOSE_INGEST_GATEWAY_RATE_BYTES_PER_S=str(settings.gateway_rate_bytes_per_s))
    host, port = url.removeprefix("http://").split(":")
    p = int(port)
    deadline = time.monotonic() + 30
    while "listening on" not in (tmp / f"gw-{name}.log").read_text() and time.monotonic() < deadline:
        time.sleep(0.1)  # /healthz answers from the early server first; the gateway itself serves after this
    time.sleep(0.3)
    stop = threading.Event()
    health: list[float] = []
    good: list[float] = []
    bad_status: dict[int, int] = {}
    hostile_times: list[float] = []
    good_failed = [0]
    health_failed = [0]
    lock = threading.Lock()

    def attacker() -> None:
        assert bomb is not None
        conn: list[http.client.HTTPConnection] = []  # kept alive: a new connection per bomb would exhaust ports
        while not stop.is_set():
            status, took = post(host, p, bomb[0], hostile_token, bomb[1], conn=conn)
            with lock:
                bad_status[status] = bad_status.get(status, 0) + 1
                hostile_times.append(took)
            if status == 429:
                time.sleep(0.05)  # a client that reads Retry-After would wait longer: this one is rude

    def prober() -> None:
        while not stop.is_set():
            status, took = get(host, p, "/healthz")
            if status == 200:
                health.append(took)
            else:
                health_failed[0] += 1
            time.sleep(0.05)

    def tap() -> None:
        seq = 0
        run = f"good/{uuid4().hex[:8]}"
        while not stop.is_set():
            line = orjson.dumps({"run": run, "seq": seq, "ts": int(time.time() * 1000), "kind": "line",
                                 "stream": "stdout", "line": "x" * 400}) + b"\n"
            status, took = post(host, p, line, good_token, "")
            if status == 200:
                good.append(took)
                seq += 1
            else:
                good_failed[0] += 1
            time.sleep(0.1)

    threads = [threading.Thread(target=prober), threading.Thread(target=tap)]
    if bomb is not None:
        threads += [threading.Thread(target=attacker) for _ in range(hostile)]
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join(timeout=600)
    hwm = vm_hwm_mib(proc.pid)
    alive = proc.poll() is None
    bench_gateway_stop(proc)

    def pct(xs: list[float], q: float) -> float:
        if not xs:
            return float("nan")
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(q * len(xs)))]

    return {"name": name, "health_max": max(health, default=float("nan")), "health_p99": pct(health, 0.99),
            "good_max": max(good, default=float("nan")), "good_p99": pct(good, 0.99), "good_ok": len(good),
            "good_failed": good_failed[0], "health_failed": health_failed[0], "hostile": dict(sorted(bad_status.items())),
            "hostile_median_s": statistics.median(hostile_times) if hostile_times else float("nan"),
            "rss_hwm_mib": hwm, "alive": alive}


def bench_gateway_stop(proc) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except Exception:
        proc.kill()
        proc.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--hostile", type=int, default=4, help="concurrent hostile connections")
    ap.add_argument("--only", default="", help="comma-separated bomb names")
    ap.add_argument("--root", default=str(ROOT), help="the source tree whose gateway runs (before/after)")
    args = ap.parse_args()
    all_bombs = bombs()
    names = [n for n in args.only.split(",") if n] or list(all_bombs)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        server = start_redis(dir=str(tmp / "redis"))
        try:
            settings = Settings(redis_url=server.url, namespace=f"bomb{uuid4().hex[:6]}", shards=2)
            client = redis.Redis.from_url(server.url)
            hostile_token, _ = tokens.create(client, settings.layout, "evil/", {})
            good_token, _ = tokens.create(client, settings.layout, "good/", {})
            root = Path(args.root)
            control = one("control", None, settings, tmp, hostile_token, good_token, args.seconds, args.hostile, root)
            rows = [control]
            for name in names:
                rows.append(one(name, all_bombs[name], settings, tmp, hostile_token, good_token, args.seconds,
                                args.hostile, root))
        finally:
            server.close()
    print(f"{'bomb':22} {'healthz max/p99 ms':>19} {'x ctl':>6} {'tap max/p99 ms':>16} {'x ctl':>6} {'tap ok/fail':>11} "
          f"{'RSS MiB':>8} {'hostile replies (status: n)':>30} {'hostile med s':>13}")
    for r in rows:
        hx = r["health_max"] / control["health_max"] if control["health_max"] else float("nan")
        gx = r["good_max"] / control["good_max"] if control["good_max"] else float("nan")
        print(f"{r['name']:22} {r['health_max'] * 1000:9.1f}/{r['health_p99'] * 1000:<9.1f} {hx:6.1f} "
              f"{r['good_max'] * 1000:7.1f}/{r['good_p99'] * 1000:<8.1f} {gx:6.1f} {r['good_ok']:>5}/{r['good_failed']:<5} "
              f"{r['rss_hwm_mib']:8.0f} {str(r['hostile']):>30} {r['hostile_median_s']:13.3f}"
              + (f"  ({r['health_failed']} /healthz failed)" if r["health_failed"] else "")
              + ("" if r["alive"] else "  (gateway died)"))
    for status, reply in sorted(SAID.items()):
        print(f"first {status} reply: {reply!r}")
    worst = max(max(r["health_max"], r["good_max"]) for r in rows)
    peak = max(r["rss_hwm_mib"] for r in rows)
    print(f"worst /healthz or tap latency {worst * 1000:.0f} ms (target < 1000); peak RSS {peak:.0f} MiB "
          f"(chart limit {MEMORY_LIMIT_MIB})")
    failed = sum(r["health_failed"] + r["good_failed"] for r in rows)
    return 0 if worst < 1.0 and peak < MEMORY_LIMIT_MIB and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
