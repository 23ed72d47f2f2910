"""The tap's cost beside the agent: CPU per line, peak RSS and added latency at several rates.

A small emitter process prints ~445-byte goose stream-json lines at a fixed rate (each line carries
the wall-clock ms at which it was written); `goose-ingest tap -- emitter` wraps it and publishes to a
private redis-server. Measured per rate:

- CPU per line: the tap's user+system CPU (from wait4, which includes its reaped children) minus the
  emitter's own CPU (the emitter writes its getrusage at exit) and minus the fixed cost of a tap that
  publishes one line (interpreter start, connect, eof), divided by the lines published; the fixed
  cost is printed on its own line;
- peak RSS: the tap process's own VmHWM (/proc/PID/status, polled until it exits). Not wait4's
  ru_maxrss: Linux carries a process's max RSS across exec, so a tap spawned (vfork) by this big
  bench process would inherit the bench's RSS. "own MiB" is that minus the floor of a process that
  only builds the Settings (printed above the table);
- added latency: Redis assigns each raw entry's stream id from its clock at XADD time, so
  `id ms - written ms` is the delay the tap adds (p50, p99, max; millisecond resolution).

    python bench/tap.py [--rates 10,1000,10000] [--seconds 10]

Targets (issue 13): <= 10 us CPU per line and < 40 MiB RSS at 10,000 lines/s; added latency
< 50 ms at low rates.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import orjson
import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from contracts.keys import KeyLayout  # noqa: E402
from services.broker.embedded import start_redis  # noqa: E402

EMITTER = textwrap.dedent(
    """
    import json, os, resource, sys, time
    rate, seconds, usage_path = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    pad = "x" * 300
    out = sys.stdout
    start = time.monotonic()
    total = int(rate * seconds)
    for i in range(total):
        due = start + i / rate
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        line = json.dumps({"type": "message", "message": {"role": "assistant", "created": 0,
               "content": [{"type": "text", "text": pad}], "metadata": {"t": time.time_ns() // 1_000_000}}})
        out.write(line + "\\n")
        if rate <= 1000:
            out.flush()  # a real agent flushes each line; at 10k/s the pipe buffer batches anyway
    out.flush()
    ru = resource.getrusage(resource.RUSAGE_SELF)
    with open(usage_path, "w") as f:
        f.write(repr(ru.ru_utime + ru.ru_stime))
    """
)


def measure(url: str, rate: float, seconds: float, tmp: Path) -> dict:
    emitter = tmp / "emitter.py"
    emitter.write_text(EMITTER)
    usage = tmp / f"emitter-{rate}.cpu"
    run = f"bench/tap-{int(rate)}-{time.time_ns()}"
    env = {**os.environ, "GOOSE_INGEST_REDIS_URL": url, "GOOSE_INGEST_SPOOL_DIR": str(tmp / "spool")}
    # An installed tap imports cached bytecode; compiling a module whose cache is stale (an edited
    # tree under PYTHONDONTWRITEBYTECODE) costs MiBs of peak RSS. Let the warm-up runs write the caches.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    cmd = [sys.executable, "-m", "services.cli", "tap", "--quiet", "--run", run, "--",
           sys.executable, str(emitter), str(rate), str(seconds), str(usage)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    hwm_kib = [0]
    done = threading.Event()

    def poll_hwm() -> None:  # VmHWM only grows: the last read before the exit is the peak (within 20 ms)
        status_path = f"/proc/{proc.pid}/status"
        while not done.is_set():
            try:
                with open(status_path) as f:
                    m = re.search(r"VmHWM:\s+(\d+)", f.read())
            except OSError:
                return
            if m:
                hwm_kib[0] = max(hwm_kib[0], int(m.group(1)))
            done.wait(0.02)

    poller = threading.Thread(target=poll_hwm, daemon=True)
    poller.start()
    _, status, ru = os.wait4(proc.pid, 0)
    done.set()
    poller.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"tap exited {proc.returncode}")
    tap_cpu = ru.ru_utime + ru.ru_stime - float(usage.read_text())
    client = redis.Redis.from_url(url)
    layout = KeyLayout()
    stream = layout.raw_stream(layout.shard_of(run))
    delays: list[int] = []
    lines = 0
    for sid, fields in client.xrange(stream):
        if fields.get(b"run", b"").decode() != run or fields.get(b"kind", b"line") != b"line":
            continue
        lines += 1
        written = orjson.loads(fields[b"line"])["message"]["metadata"]["t"]
        delays.append(int(sid.split(b"-")[0]) - written)
    client.close()
    delays.sort()
    return {
        "rate": rate,
        "lines": lines,
        "cpu_s": tap_cpu,
        "rss_mib": hwm_kib[0] / 1024,
        "p50_ms": statistics.median(delays) if delays else float("nan"),
        "p99_ms": delays[int(0.99 * (len(delays) - 1))] if delays else float("nan"),
        "max_ms": delays[-1] if delays else float("nan"),
    }


# Peak RSS of processes that only load what every tap needs. "python + Settings()" is the floor no tap
# can go below (pydantic-settings imports asyncio, hence ssl); the tap's own cost is its RSS minus that.
# "+ redis-py" is what the tap paid before it had its own connection (cluster taps still do).
RSS_FLOORS = {
    "python + Settings()": "from services.settings import Settings\nSettings().layout\n",
    "python + Settings() + redis-py": "import redis\nfrom services.settings import Settings\nSettings().layout\n",
}
_PRINT_HWM = "import re\nprint(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1))\n"


def rss_floor_mib(code: str) -> float:
    out = subprocess.run([sys.executable, "-c", code + _PRINT_HWM], cwd=ROOT, capture_output=True, check=True,
                         text=True)
    return int(out.stdout.strip()) / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default="10,1000,10000", help="comma-separated lines/s")
    ap.add_argument("--seconds", type=float, default=10.0, help="duration per rate")
    args = ap.parse_args()
    rates = [float(r) for r in args.rates.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        server = start_redis(dir=str(Path(tmp) / "redis"))
        try:
            fixed = [measure(server.url, 1000.0, 0.001, Path(tmp))["cpu_s"] for _ in range(3)]
            fixed_s = statistics.median(fixed)
            rows = [measure(server.url, rate, args.seconds, Path(tmp)) for rate in rates]
        finally:
            server.close()
    print(f"fixed cost of one tap (start, connect, one line, eof): {fixed_s * 1000:.0f} ms CPU")
    floors = {name: rss_floor_mib(code) for name, code in RSS_FLOORS.items()}
    for name, mib in floors.items():
        print(f"RSS floor ({name}, no work): {mib:.1f} MiB")
    floor = floors["python + Settings()"]
    for r in rows:
        r["cpu_us_per_line"] = 1e6 * max(r["cpu_s"] - fixed_s, 0.0) / max(r["lines"], 1)
    print(f"{'lines/s':>8} {'lines':>7} {'CPU us/line':>12} {'RSS MiB':>8} {'own MiB':>8} {'p50 ms':>7} {'p99 ms':>7} "
          f"{'max ms':>7}")
    for r in rows:
        print(f"{r['rate']:>8.0f} {r['lines']:>7} {r['cpu_us_per_line']:>12.1f} {r['rss_mib']:>8.1f} "
              f"{r['rss_mib'] - floor:>8.1f} {r['p50_ms']:>7.0f} {r['p99_ms']:>7.0f} {r['max_ms']:>7.0f}")


if __name__ == "__main__":
    main()
