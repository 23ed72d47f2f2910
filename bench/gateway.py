"""The ingest gateway against direct Redis: the same taps, same rates, same run (issue 21 part 8).

N taps (the tap's own Publisher: spool, batching, fsync, resend; one per run, each with its sender
thread) in this process share an offered rate of ~445-byte goose lines; each line carries the
wall-clock ms at which it was added. Three modes, interleaved per rate:

- direct: each Publisher writes to a private redis-server itself (hand-built RESP pipeline);
- 1 gateway: each posts its batches to one `goose-ingest gateway` process (urllib, NDJSON, gzip);
- 2 gateways: half the taps to each of two gateway processes (no load balancer in between).

Measured per mode and rate: delivered lines/s (lines / time until the last one is confirmed) and
the delay each line saw (Redis stream id ms - written ms: p50, p99). The ratio is gateway/direct
delivered lines/s; "added" is the gateway's percentile minus direct's. Each tap first sends one
warm-up line (a new spool file, the sender thread's first run, a new connection: once per tap, which
runs for a whole agent session), reported apart as "first line"; ``--no-warmup`` counts them in
(then, with 200 taps for 5 s, they are 4% of the lines: the whole p99). "runq ms/s": the time the
taps' and the gateways' threads waited for a CPU per second (/proc schedstat): how much the
machine's other work delayed this mode. ``TMPDIR=/dev/shm`` keeps the spools' fsyncs off a shared
disk (a stall there delays every mode's taps alike).

    python bench/gateway.py [--taps 200] [--rates 1000,10000] [--seconds 5] [--trace DIR] [--order direct,1,2]
    python bench/gateway.py --requests [--connections 50] [--seconds 5] [--entries 1]

``--requests`` measures one gateway process alone: requests/s it serves for one-entry POSTs (or
``--entries`` per POST) from a closed loop of kept-alive connections (a raw-socket asyncio client with
pre-built requests, so the client costs little of the shared cores), and their p50/p99 latency,
on uvloop+httptools, uvloop+h11 and asyncio+h11 (modules hidden from the gateway process).
``--compare DIR`` adds another source tree's gateway (e.g. ``git archive <commit> | tar -x -C DIR``)
to either mode, in the same run: before/after ratios that share the machine's load (on asyncio+h11
unless ``--compare-without ''``). ``--trace DIR`` splits each line's delay into stages and lists every
process's garbage collections and the gateways' event-loop lateness (bench/gateway_trace.py).

Targets (issue 21): >= 0.5 of direct with one gateway process; p99 added < 20 ms at 1,000 lines/s.
Everything (taps, gateways, Redis) shares this machine's cores: on 2 cores the taps' own CPU is part
of every figure, alike for all modes.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import orjson
import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from services.broker.embedded import free_port, start_redis  # noqa: E402
from services.gateway import tokens  # noqa: E402
from services.settings import Settings  # noqa: E402
from services.tap.publisher import Publisher  # noqa: E402

PAD = "x" * 300


def start_gateway(settings: Settings, tmp: Path, name: str, without: tuple[str, ...] = (),
                  root: Path = ROOT, trace: Path | None = None, **extra: str) -> tuple[subprocess.Popen, str]:
    """A `goose-ingest gateway` process; ``without`` hides installed modules from it (e.g. uvloop, httptools:
    the same code on the stack uvicorn falls back to, for a same-run comparison)."""
    port = free_port()
    env = {"PATH": "/usr/bin:/bin", "GOOSE_INGEST_REDIS_URL": settings.redis_url or "",
           "GOOSE_INGEST_NAMESPACE": settings.namespace, "GOOSE_INGEST_SHARDS": str(settings.shards),
           "GOOSE_INGEST_GATEWAY_RATE_LINES_PER_S": "0", "GOOSE_INGEST_GATEWAY_RATE_BYTES_PER_S": "0", **extra}
    hide = "".join(f"sys.modules[{m!r}] = None; " for m in without)
    if trace is not None:  # bench/gateway_trace.py: per-request stages, GC and loop lag, dumped at exit
        hide += (f"sys.path.insert(0, {str(ROOT / 'bench')!r}); import gateway_trace; "
                 f"gateway_trace.install_gateway({str(trace / (name + '.json'))!r}); ")
    code = f"import sys; {hide}from services.cli import main; sys.exit(main())"
    proc = subprocess.Popen([sys.executable, "-c", code, "gateway", "--host", "127.0.0.1", "--port", str(port)],
                            cwd=root, env=env, stdout=(tmp / f"{name}.log").open("ab"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=2):
                return proc, url
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"gateway {name} did not start: {(tmp / f'{name}.log').read_text()}")


def cpu_s(pid: int | None = None) -> float:
    """CPU seconds (user + system) of this process (None) or of a child process."""
    if pid is None:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def runq_wait_s(pid: int | str = "self") -> float:
    """Seconds the process's threads spent runnable but waiting for a CPU (/proc/<pid>/task/*/schedstat): how
    much the machine's other work delayed it. Threads that ended are not counted."""
    total = 0
    for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            total += int(stat.read_text().split()[1])
        except (OSError, IndexError, ValueError):
            pass
    return total / 1e9


def run_mode(base: Settings, client: redis.Redis, tmp: Path, mode: str, endpoints: list[str], token: str,
             taps: int, rate: float, seconds: float, gateway_pids: list[int] = (), trace: bool = False,
             warmup: bool = True) -> dict:
    tag = f"{mode.replace(' ', '-')}-{int(rate)}"
    pubs = []
    for i in range(taps):
        s = base.model_copy(update={"spool_dir": str(tmp / "spool" / tag)})
        if endpoints:
            s = s.model_copy(update={"endpoint": endpoints[i % len(endpoints)],
                                     "token": tokens_secret(token)})
        pubs.append(Publisher(s, f"bench/{tag}/{i}", {"host": "bench"}))
    # 200 taps in one process share one garbage collector: each full collection walked this whole process
    # (the bench, redis-py, 200 publishers: 30 ms of CPU, 60-90 ms wall at load ~10, 3-4 times a mode) and
    # stalled all 200 taps at once, 30-90 lines each time -- enough on its own to set a mode's p99. In a
    # fleet each tap is a process with a heap of its own. Freezing what exists now keeps the collections
    # to what the lines make, in every mode alike.
    gc.collect()
    gc.freeze()
    if warmup:
        # Each tap's first line, at the offered rate, before the measured lines: it pays for a new spool
        # file, the sender thread's first run and a new connection -- once per tap, which runs for a whole
        # agent session, but 200 of 5,000 lines (4%) in a 5 s run, i.e. the whole of the p99. Reported apart.
        start = time.monotonic()
        for i, p in enumerate(pubs):
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            p.add_line(orjson.dumps({"type": "message", "written": time.time_ns() // 1_000_000, "first": 1, "pad": PAD}))
        for p in pubs:
            p.flush(timeout=120)
    cpu_before = cpu_s(), sum(cpu_s(p) for p in gateway_pids)
    wait_before = runq_wait_s(), sum(runq_wait_s(p) for p in gateway_pids)
    total = int(rate * seconds)
    start = time.monotonic()
    for i in range(total):
        due = start + i / rate
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        written = time.time_ns() // 1_000_000
        line = orjson.dumps({"type": "message", "written": written, "pad": PAD})
        pubs[i % taps].add_line(line)
    for p in pubs:
        p.flush(timeout=120)
    elapsed = time.monotonic() - start
    taps_cpu, gw_cpu = cpu_s() - cpu_before[0], sum(cpu_s(p) for p in gateway_pids) - cpu_before[1]
    taps_wait = runq_wait_s() - wait_before[0]
    gw_wait = sum(runq_wait_s(p) for p in gateway_pids) - wait_before[1]
    for p in pubs:
        p.close(timeout=5)
    gc.unfreeze()
    delays = []
    firsts = []  # the warm-up's first line of each tap
    lines = []  # (run, seq, written ms, Redis ms) for --trace
    seen: set[tuple[bytes, bytes]] = set()
    copies = 0
    for stream in base.layout.raw_streams():
        for sid, f in client.xrange(stream):
            if (f[b"run"], f[b"seq"]) in seen:  # resent after a timeout: the workers drop it
                copies += 1
                continue
            seen.add((f[b"run"], f[b"seq"]))
            ms = int(sid.split(b"-")[0])
            doc = orjson.loads(f[b"line"])
            written = doc["written"]
            if doc.get("first"):
                firsts.append(ms - written)
                continue
            delays.append(ms - written)
            if trace:
                lines.append((f[b"run"].decode(), int(f[b"seq"]), written, ms))
        client.delete(stream)
    assert len(delays) == total, (mode, len(delays), total)
    delays.sort()
    firsts.sort()
    return {"first_p50": statistics.median(firsts) if firsts else 0, "first_max": firsts[-1] if firsts else 0,"lines_per_s": total / elapsed, "p50": statistics.median(delays), "copies": copies, "lines": lines,
            "taps_cpu": taps_cpu / elapsed, "gw_cpu": gw_cpu / elapsed,
            "taps_wait": taps_wait / elapsed * 1000, "gw_wait": gw_wait / elapsed * 1000,
            "p99": delays[min(len(delays) - 1, int(len(delays) * 0.99))]}


async def _closed_loop(host: str, port: int, request_for, connections: int, seconds: float) -> tuple[int, list[float]]:
    """``connections`` kept-alive connections, each sending its next request when the last is answered."""
    latencies: list[float] = []
    done = 0
    stop_at = time.monotonic() + seconds

    async def one(c: int) -> None:
        nonlocal done
        reader, writer = await asyncio.open_connection(host, port)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(__import__("socket").IPPROTO_TCP, __import__("socket").TCP_NODELAY, 1)
        n = 0
        while time.monotonic() < stop_at:
            req = request_for(c, n)
            started = time.perf_counter()
            writer.write(req)
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            await reader.readexactly(length)
            assert head.startswith(b"HTTP/1.1 200"), head[:200]
            latencies.append(time.perf_counter() - started)
            done += 1
            n += 1
        writer.close()

    await asyncio.gather(*(one(c) for c in range(connections)))
    return done, latencies


def requests_mode(args: argparse.Namespace) -> None:
    """Requests/s of one gateway process: how much a request costs, apart from the taps."""
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        server = start_redis(dir=str(tmp / "redis"))
        try:
            base = Settings(redis_url=server.url, shards=4, spool_dir=str(tmp / "spool"))
            client = redis.Redis(port=server.port)
            token, _ = tokens.create(client, base.layout, "bench/", {})
            line = orjson.dumps({"type": "message", "pad": PAD}).decode()

            def request_for(c: int, n: int) -> bytes:
                body = b"".join(orjson.dumps({"run": f"bench/c{c}", "seq": n * args.entries + k, "ts": 1767225600000,
                                              "kind": "line", "stream": "stdout", "line": line}) + b"\n"
                                for k in range(args.entries))
                return (b"POST /v1/raw HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer " + token.encode()
                        + b"\r\nContent-Type: application/x-ndjson\r\nContent-Length: %d\r\n\r\n" % len(body) + body)

            stacks: dict[str, tuple[tuple[str, ...], Path]] = {
                "uvloop+h11": (("httptools",), ROOT), "asyncio+h11": (("uvloop", "httptools"), ROOT),
                "uvloop+httptools": ((), ROOT)}
            if args.compare:  # another tree's gateway (e.g. `git archive` of an older commit), on asyncio+h11 by default
                stacks["--compare tree"] = (_modules(args.compare_without), Path(args.compare))
            print(f"{args.connections} connections, {args.entries} entries a request, {args.seconds:.0f} s per stack and round")
            for rnd in range(args.rounds):
                for name, (without, root) in stacks.items():
                    proc, url = start_gateway(base, tmp, f"gw-{rnd}", without, root)
                    host, port = url.removeprefix("http://").split(":")
                    asyncio.run(_closed_loop(host, int(port), request_for, args.connections, 1.0))  # warm-up
                    done, lat = asyncio.run(_closed_loop(host, int(port), request_for, args.connections, args.seconds))
                    proc.terminate()
                    proc.wait(timeout=10)
                    lat.sort()
                    print(f"  {name:>17}: {done / args.seconds:6.0f} requests/s, {done * args.entries / args.seconds:7.0f} "
                          f"entries/s, p50 {statistics.median(lat) * 1000:5.1f} ms, p99 {lat[int(len(lat) * 0.99)] * 1000:6.1f} ms")
        finally:
            server.close()


def _modules(names: str) -> tuple[str, ...]:
    return tuple(m for m in names.split(",") if m)


def tokens_secret(token: str):  # a SecretStr for the settings, as the environment would give it
    from pydantic import SecretStr

    return SecretStr(token)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--taps", type=int, default=200)
    ap.add_argument("--rates", default="1000,10000")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--requests", action="store_true", help="requests/s of one gateway process (see above)")
    ap.add_argument("--connections", type=int, default=50)
    ap.add_argument("--entries", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--without", default="", help="modules hidden from the gateways, e.g. uvloop,httptools")
    ap.add_argument("--no-warmup", action="store_true",
                    help="count each tap's first line (new spool, thread, connection) among the measured ones")
    ap.add_argument("--trace", default="", metavar="DIR",
                    help="split each line's delay into stages (bench/gateway_trace.py), GC and event-loop lag; "
                         "gateway traces are written to DIR")
    ap.add_argument("--order", default="", metavar="MODES",
                    help="the modes and their order, from direct,1,2,compare (direct first: the others are "
                         "compared with it); default all")
    ap.add_argument("--compare-without", default="uvloop,httptools", metavar="MODULES",
                    help="modules hidden from the --compare tree's gateway ('' : the same stack as this tree's)")
    ap.add_argument("--compare", default="", metavar="DIR",
                    help="also measure the gateway of another source tree (asyncio+h11), e.g. `git archive` of a commit")
    args = ap.parse_args()
    if args.requests:
        requests_mode(args)
        return
    # the taps' "unreachable, spooling" lines (timeouts, 503 at saturation) would bury the table: counted as resent
    logging.getLogger("goose_ingest").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        server = start_redis(dir=str(tmp / "redis"))
        procs = []
        trace_dir = Path(args.trace) if args.trace else None
        tap_trace = None
        if trace_dir is not None:
            import gateway_trace

            trace_dir.mkdir(parents=True, exist_ok=True)
            tap_trace = gateway_trace.install_taps()
        traced: dict[str, list] = {}
        try:
            base = Settings(redis_url=server.url, shards=4, spool_dir=str(tmp / "spool"))
            client = redis.Redis(port=server.port)
            gws = []
            for name in ("gw1", "gw2"):
                proc, url = start_gateway(base, tmp, name, _modules(args.without),
                                          trace=trace_dir)
                procs.append(proc)
                gws.append(url)
            modes = {"direct": [], "1 gateway": gws[:1], "2 gateways": gws}
            if args.compare:  # the same taps through another tree's gateway, same run
                proc, url = start_gateway(base, tmp, "gw-compare", _modules(args.compare_without), Path(args.compare),
                                          trace=trace_dir)
                procs.append(proc)
                modes["1 gw --compare"] = [url]
            if args.order:  # e.g. direct,compare,1 (same-run comparisons, each in either position)
                names = {"direct": "direct", "1": "1 gateway", "2": "2 gateways", "compare": "1 gw --compare"}
                modes = {names[m]: modes[names[m]] for m in args.order.split(",")}
            token, _ = tokens.create(client, base.layout, "bench/", {})
            print(f"{args.taps} taps, {args.seconds:.0f} s per rate and mode, ~445-byte lines")
            print(f"{'rate':>7} {'mode':>15} {'lines/s':>9} {'ratio':>6} {'p50 ms':>7} {'p99 ms':>7} {'+p50':>6} {'+p99':>6} {'resent':>6} {'taps cpu':>8} {'gw cpu':>6} {'runq ms/s':>10}"
                  + ("" if args.no_warmup else f" {'first line p50/max ms':>21}"))
            for rate in (float(r) for r in args.rates.split(",")):
                results = {}
                for mode, endpoints in modes.items():
                    pids = [procs[gws.index(e)].pid if e in gws else procs[-1].pid for e in endpoints]
                    results[mode] = run_mode(base, client, tmp, mode, endpoints, token, args.taps, rate, args.seconds, pids,
                                             trace=trace_dir is not None, warmup=not args.no_warmup)
                    traced[f"{mode} @ {rate:.0f}"] = results[mode].pop("lines")
                direct = results["direct"]
                for mode, r in results.items():
                    ratio = r["lines_per_s"] / direct["lines_per_s"]
                    print(f"{rate:>7.0f} {mode:>15} {r['lines_per_s']:>9.0f} {ratio:>6.2f} {r['p50']:>7.0f} "
                          f"{r['p99']:>7.0f} {r['p50'] - direct['p50']:>6.0f} {r['p99'] - direct['p99']:>6.0f} {r['copies']:>6} {r['taps_cpu']:>8.2f} {r['gw_cpu']:>6.2f} {r['taps_wait']:>4.0f} / {r['gw_wait']:>3.0f}"
                          + ("" if args.no_warmup else f" {r['first_p50']:>10.0f} / {r['first_max']:>8.0f}"))
        finally:
            for p in procs:
                p.terminate()
                p.wait(timeout=10)
            server.close()
        if trace_dir is not None and tap_trace is not None:
            import json

            import gateway_trace

            gw = {n: json.loads((trace_dir / f"{n}.json").read_text()) for n in ("gw1", "gw2", "gw-compare")
                  if (trace_dir / f"{n}.json").exists()}
            requests = [r for g in gw.values() for r in g["requests"]]
            print("\nwhere the delay goes (bench/gateway_trace.py):")
            stalls = {f"taps {k}": v for k, v in gateway_trace.stall_spans(tap_trace["gc"].events).items()}
            for n, g in gw.items():
                stalls.update({f"{n} {k}": v for k, v in gateway_trace.stall_spans(g["gc"], g["lags"]).items()})
            for mode, lines in traced.items():
                gateway_trace.analyse(mode, lines, tap_trace["sends"], requests, stalls)
            gateway_trace.pauses("taps (this process)", tap_trace["gc"].events, frozen=gc.get_freeze_count())
            for n, g in gw.items():
                serving = min((r["asgi"] for r in g["requests"]), default=0.0)  # not the start-up's collections
                gateway_trace.pauses(f"{n} ({', '.join(g.get('loop', []))})", [e for e in g["gc"] if e[1] >= serving],
                                     g["lags"], frozen=g.get("frozen"))


if __name__ == "__main__":
    main()
