"""Where a line's latency goes, tap to Redis (bench-only; ``python bench/gateway.py --trace DIR``).

Nothing here is imported by the gateway or the tap: the bench installs these wrappers in its own
process (the taps) and, through ``start_gateway``, in each gateway process it starts. Every stamp is
wall-clock (``time.time()``), the clock the line's ``written`` ms and Redis's stream id share, so a
line's delay splits into:

- wake: ``written`` -> the sender thread took the batch (its wake-up, pacing, the GIL);
- fsync: the spool's fdatasync before the batch is sent;
- tap: the rest, until the transport's ``send`` starts;
- client: ``send`` starts -> http.client writes the request's head (the tap's Python, the GIL);
- wire: head written -> the gateway's protocol received its first bytes (the kernel, the gateway's
  event loop getting to the socket);
- loop: received -> the ASGI handler runs (the event loop's backlog);
- handler: token, body, parse, checks -> enqueued to the group commit;
- commit: enqueued -> the pipeline holding it is written (waiting for a free pipeline);
- redis: pipeline written -> the stream id's ms (Redis's own time of the XADD).

Also recorded in each process: every garbage collection (generation, start, duration) and, in the
gateway, the event loop's lateness (a 1 ms timer: how late it fired, when over 2 ms).
"""

from __future__ import annotations

import atexit
import contextvars
import gc
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

_current: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("bench_trace", default=None)


class GcLog:
    """Every collection of this process: [generation, start, seconds]."""

    def __init__(self) -> None:
        self.events: list[tuple[int, float, float, float]] = []
        self._start = 0.0
        gc.callbacks.append(self._cb)

    def _cb(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
            self._cpu = time.thread_time()
            self._wall = time.time()
        else:  # wall time (what stalled the process, preemption by other processes included) and CPU time
            self.events.append((info["generation"], self._wall, time.perf_counter() - self._start,
                                time.thread_time() - self._cpu))


def install_taps() -> dict[str, Any]:
    """In the bench process: the start and end of every batch a transport sends (run, first seq)."""
    import threading

    import orjson

    from services.tap import http_transport, spool, transports

    out: dict[str, Any] = {"sends": [], "gc": GcLog()}
    sends = out["sends"]
    local = threading.local()  # the sender thread's latest fdatasync: (start, end)
    orig_sync = spool.Spool.sync

    def sync(self: Any) -> None:
        t = time.time()
        orig_sync(self)
        local.sync = (t, time.time())

    spool.Spool.sync = sync
    import http.client

    orig_hsend = http.client.HTTPConnection.send

    def hsend(self: Any, data: Any) -> None:  # the request's last write (head, then body) reached the socket
        if getattr(local, "head", None) is None:
            local.head = time.time()
        orig_hsend(self, data)

    http.client.HTTPConnection.send = hsend

    def wrap(cls: Any, first_of: Any) -> None:
        orig = cls.send

        def send(self: Any, batch: Any) -> None:
            local.head = None
            t0 = time.time()
            orig(self, batch)
            run, seq = first_of(batch)
            synced = getattr(local, "sync", (t0, t0))
            sends.append((run, seq, len(batch), t0, time.time(), synced[0], synced[1], local.head or t0))

        cls.send = send

    def first_http(raws: list[bytes]) -> tuple[str, int]:
        rec = orjson.loads(raws[0])
        return rec["run"], int(rec["seq"])

    def first_resp(cmds: list[bytes]) -> tuple[str, int]:
        # *N $4 XADD $len key $1 * $3 run $len <run> $3 seq $len <seq> ...
        parts = cmds[0].split(b"\r\n")
        f = parts[6:]
        fields = {f[i]: f[i + 2] for i in range(2, len(f) - 2, 4)}
        return fields[b"run"].decode(), int(fields[b"seq"])

    wrap(http_transport.HttpTransport, first_http)
    wrap(transports.RespTransport, first_resp)
    return out


def install_gateway(path: str) -> None:
    """In a gateway process (before ``services.cli.main``): per request, the stages above; GC; loop lag.
    Written as JSON to ``path`` at exit (the bench stops a gateway with SIGTERM: uvicorn exits cleanly)."""
    from services.gateway import app as app_mod
    from services.gateway import http as http_mod
    from services.gateway import writer as writer_mod

    requests: list[dict[str, Any]] = []
    lags: list[tuple[float, float]] = []
    loop_class: list[str] = []  # the event loop's class (uvloop.Loop when uvicorn picked uvloop)
    gclog = GcLog()

    # the protocol: when the bytes of a request's head first arrived (data_received of its first byte)
    orig_protocol_class = http_mod.protocol_class

    def protocol_class(head_timeout_s: float) -> Any:
        base = orig_protocol_class(head_timeout_s)
        if isinstance(base, str):
            return base

        class Traced(base):  # type: ignore[misc,valid-type]
            _t_first = 0.0
            _t_made = 0.0

            def connection_made(self, transport: Any) -> None:
                self._t_made = time.time()
                super().connection_made(transport)

            def data_received(self, data: bytes) -> None:
                if self._head_open and self._head_bytes == 0:
                    self._t_first = time.time()
                super().data_received(data)

            def on_headers_complete(self) -> None:
                t_first = self._t_first
                super().on_headers_complete()
                self.scope["bench_recv"] = t_first  # the ASGI task is created, not yet run
                self.scope["bench_made"], self._t_made = self._t_made, 0.0  # the connection's first request only

        return Traced

    http_mod.protocol_class = protocol_class

    # the handler: entry, enqueued to the group commit, its reply, the response handed to the protocol
    orig_app = app_mod.Gateway.app

    def app(self: Any) -> Any:
        inner = orig_app(self)
        loop_started = False

        async def traced(scope: dict[str, Any], receive: Any, send: Any) -> None:
            nonlocal loop_started
            if not loop_started:
                loop_started = True
                import asyncio

                loop = asyncio.get_running_loop()
                loop_class.append(f"{type(loop).__module__}.{type(loop).__name__}")
                loop.create_task(_lag_monitor(lags))
            if scope.get("type") != "http" or scope.get("path") != "/v1/raw":
                await inner(scope, receive, send)
                return
            rec: dict[str, Any] = {"recv": scope.get("bench_recv", 0.0), "asgi": time.time(),
                                   "made": scope.get("bench_made", 0.0)}
            _current.set(rec)

            async def send_traced(message: dict[str, Any]) -> None:
                if message.get("type") == "http.response.body":
                    rec["respond"] = time.time()
                await send(message)

            await inner(scope, receive, send_traced)
            requests.append(rec)

        return traced

    app_mod.Gateway.app = app

    orig_write_async = app_mod.Gateway.write_async

    async def write_async(self: Any, accepted: list[Any]) -> None:
        rec = _current.get()
        if rec is not None:
            rec["run"] = accepted[0].run
            rec["seq"] = int(accepted[0].fields[b"seq"])
            rec["n"] = len(accepted)
            rec["enqueue"] = time.time()
        await orig_write_async(self, accepted)
        if rec is not None:
            rec["replied"] = time.time()

    app_mod.Gateway.write_async = write_async

    # a token lookup that went to Redis (the cache had no answer): runs in a worker thread, which sees a
    # copy of the request's context, hence its record
    orig_check = app_mod.Gateway.check_token

    def check_token(self: Any, presented: str) -> Any:
        t = time.time()
        try:
            return orig_check(self, presented)
        finally:
            rec = _current.get()
            if rec is not None:
                rec["token_miss"] = (time.time() - t) * 1000

    app_mod.Gateway.check_token = check_token

    # the group commit: when a request's commands were taken into a pipeline, and the group's size (the
    # commands list is the one the handler passed: its identity names the request)
    by_commands: dict[int, dict[str, Any]] = {}
    orig_write = writer_mod.GroupWriter.write

    async def write(self: Any, commands: list[bytes]) -> None:
        rec = _current.get()
        if rec is not None:
            rec["queued_behind"] = len(self._queue)
            rec["inflight"] = self._inflight
            by_commands[id(commands)] = rec
        try:
            await orig_write(self, commands)
        finally:
            by_commands.pop(id(commands), None)

    writer_mod.GroupWriter.write = write
    orig_take = writer_mod.GroupWriter._take_group

    def _take_group(self: Any) -> list[Any]:
        group = orig_take(self)
        t = time.time()
        for req in group:
            rec = by_commands.get(id(req.commands))
            if rec is not None:
                rec["taken"] = t
                rec["group"] = len(group)
        return group

    writer_mod.GroupWriter._take_group = _take_group

    def dump() -> None:
        Path(path).write_text(json.dumps({"requests": requests, "lags": lags, "gc": gclog.events,
                                          "frozen": gc.get_freeze_count(), "tracked": len(gc.get_objects()),
                                          "loop": loop_class[:1]}))

    atexit.register(dump)
    # uvicorn catches SIGTERM while it serves, then restores the handler it found and raises the signal
    # again once stopped: this handler (not the default's kill, which skips atexit) then ends the process
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))


async def _lag_monitor(lags: list[tuple[float, float]]) -> None:
    import asyncio

    while True:
        t = time.perf_counter()
        await asyncio.sleep(0.001)
        late = time.perf_counter() - t - 0.001
        if late > 0.002:
            lags.append((time.time(), late))


STAGES = ("wake", "fsync", "tap", "client", "wire", "loop", "handler", "commit", "redis")


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * q))] if xs else 0.0


def analyse(mode: str, lines: list[tuple[str, int, int, int]], sends: list[tuple], gw_requests: list[dict],
            stalls: dict[str, list[tuple[float, float]]]) -> None:
    """Split the delay of every line (run, seq, written ms, Redis ms) into the stages above; print the
    stages of the lines at or over the p99, and the median line's."""
    by_run: dict[str, list[tuple]] = {}
    for s in sends:
        by_run.setdefault(s[0], []).append(s)
    reqs = {(r["run"], r["seq"]): r for r in gw_requests if "run" in r}
    rows = []
    for run, seq, written, redis_ms in lines:
        send = next((s for s in reversed(by_run.get(run, [])) if s[1] <= seq < s[1] + s[2]), None)
        if send is None:
            continue
        t0, sync0, sync1 = send[3] * 1000, send[5] * 1000, send[6] * 1000
        # wake: written -> the sender took the batch (its fdatasync starts); tap: the rest up to send()
        st = {"delay": redis_ms - written, "wake": sync0 - written, "fsync": sync1 - sync0, "tap": t0 - sync1,
              "span": (written, redis_ms), "seq": seq, "t": written}
        req = reqs.get((run, send[1]))
        if req is None:  # direct: the pipeline goes straight to Redis
            st["redis"] = redis_ms - t0
        else:
            sent = max(t0, send[7] * 1000)
            if req.get("made"):
                st["accept"] = req["made"] * 1000 - sent  # head written -> the gateway accepted the connection
            if "token_miss" in req:
                st["token_miss"] = req["token_miss"]
            st.update(client=sent - t0, wire=req["recv"] * 1000 - sent, loop=(req["asgi"] - req["recv"]) * 1000,
                      handler=(req["enqueue"] - req["asgi"]) * 1000,
                      commit=(req.get("taken", req["enqueue"]) - req["enqueue"]) * 1000,
                      redis=redis_ms - req.get("taken", req["enqueue"]) * 1000, group=req.get("group", 0))
        rows.append(st)
    if not rows:
        return
    p99 = _pct([r["delay"] for r in rows], 0.99)
    tail = [r for r in rows if r["delay"] >= p99]
    present = [s for s in STAGES if s in rows[0]]

    def line(name: str, rs: list[dict]) -> str:
        return f"    {name:>22}: " + "  ".join(f"{s} {sum(r[s] for r in rs) / len(rs):6.1f}" for s in ["delay", *present])

    # the part that differs between the modes: from the transport's send() to the stream id (the tap's own
    # stages before it, wake-up and fsync, are the same code in every mode)
    sent = [r["delay"] - r["wake"] - r["fsync"] - r["tap"] for r in rows]
    print(f"  {mode}: {len(rows)} lines, p99 {p99:.0f} ms; send() -> stored p50 {_pct(sent, 0.5):.1f}, "
          f"p99 {_pct(sent, 0.99):.1f} ms; mean ms per stage")
    print(line("all lines", rows))
    print(line(f"lines >= p99 ({len(tail)})", tail))
    dominant: dict[str, int] = {}
    for r in tail:
        top = max(present, key=lambda s: r[s])
        dominant[top] = dominant.get(top, 0) + 1
    print(f"    {'largest stage of a tail line':>22}: {dominant}")
    t_first = min(r["t"] for r in rows)
    misses = [r for r in rows if "token_miss" in r]
    if misses:
        print(f"    {'token lookups in Redis':>22}: {len(misses)} lines ({sum(1 for r in tail if 'token_miss' in r)} in the tail), "
              f"lookup mean {sum(r['token_miss'] for r in misses) / len(misses):.1f} ms, handler stage mean "
              f"{sum(r['handler'] for r in misses) / len(misses):.1f} ms")
    acc = [r["accept"] for r in tail if "accept" in r]
    if acc:
        print(f"    {'tail: accepted late by':>22}: mean {sum(acc) / len(acc):.1f} ms over {len(acc)} new connections")
    print(f"    {'tail lines: first of a tap':>22}: {sum(1 for r in tail if r['seq'] == 0)} of {len(tail)}; "
          f"written at (s from the first line) " + ", ".join(f"{(r['t'] - t_first) / 1000:.2f}" for r in sorted(tail, key=lambda r: r["t"])[::max(1, len(tail) // 12)]))
    # which stalls overlap a tail line's span (written -> stored): a GC or a late event loop
    hits = {name: sum(1 for r in tail if any(a < r["span"][1] + 1 and b > r["span"][0] - 1 for a, b in spans))
            for name, spans in stalls.items()}
    none = sum(1 for r in tail if not any(a < r["span"][1] + 1 and b > r["span"][0] - 1
                                          for spans in stalls.values() for a, b in spans))
    print(f"    {'tail lines during':>22}: " + ", ".join(f"{k} {v}" for k, v in hits.items()) + f"; none of these {none}")
    if "group" in rows[0]:
        print(f"    group size: median {_pct([r['group'] for r in rows], 0.5)}, p99 {_pct([r['group'] for r in rows], 0.99)}")


def stall_spans(gc_events: list, lags: list | None = None, over_s: float = 0.005) -> dict[str, list[tuple[float, float]]]:
    """(start ms, end ms) of the collections over ``over_s`` and of the event loop's lateness over it."""
    out = {"GC": [(t * 1000, (t + d) * 1000) for _, t, d, _ in gc_events if d > over_s]}
    if lags is not None:
        out["loop late"] = [((t - d) * 1000, t * 1000) for t, d in lags if d > over_s]
    return out


def pauses(name: str, gc_events: list, lags: list | None = None, over_s: float = 0.005, frozen: int | None = None) -> None:
    """The collections of a process by generation: how many, wall and CPU ms (median, max); loop lateness."""
    parts = []
    for g in (0, 1, 2):
        ev = [e for e in gc_events if e[0] == g]
        if ev:
            wall = sorted(e[2] * 1000 for e in ev)
            cpu = sorted(e[3] * 1000 for e in ev)
            parts.append(f"gen{g} x{len(ev)} wall {wall[len(wall) // 2]:.1f}/{wall[-1]:.0f} cpu {cpu[len(cpu) // 2]:.1f}/{cpu[-1]:.1f}")
    print(f"  {name}: GC (median/max ms) " + "; ".join(parts)
          + (f"; total wall {sum(e[2] for e in gc_events) * 1000:.0f} ms, cpu {sum(e[3] for e in gc_events) * 1000:.0f} ms" if gc_events else "")
          + ("" if frozen is None else f"; frozen objects {frozen}"))
    if lags is not None:
        lags_ms = sorted((d * 1000 for _, d in lags), reverse=True)
        print(f"  {name}: event loop late by > 2 ms {len(lags_ms)} times; worst " + ", ".join(f"{x:.0f}" for x in lags_ms[:10]) + " ms")
