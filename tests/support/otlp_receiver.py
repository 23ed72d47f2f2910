"""A small real OTLP/HTTP receiver on loopback: decodes protobuf requests with opentelemetry-proto.

For what Phoenix cannot be made to do on demand: refuse (HTTP 400) the spans of chosen runs,
like a collector whose validation rejects them, and count requests. Phoenix is the backend of
the end-to-end tests (tests/support/phoenix_server.py).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


@dataclass
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    links: list[tuple[str, str]]
    start_ns: int
    end_ns: int
    status_code: int
    resource: dict[str, Any]


@dataclass
class Receiver:
    port: int
    reject_runs: set[str] = field(default_factory=set)
    spans: list[ReceivedSpan] = field(default_factory=list)
    requests: int = 0
    rejected: int = 0
    received: int = 0  # spans accepted (also counted when `keep` is off)
    keep: bool = True  # False: count only (benchmarks)
    delay_s: float = 0.0  # a slow collector: every request takes this long
    fail_status: int | None = None  # answer every request with this status (an outage), while set
    failed: int = 0
    busy: int = 0  # requests read and not yet answered (a sender killed mid-request still lands)
    answered_at: float = 0.0  # time.monotonic() of the last answer
    lock: threading.Lock = field(default_factory=threading.Lock)

    def settle(self, quiet_s: float = 1.0, timeout: float = 30.0) -> bool:
        """Wait until no request is being handled and none was answered for `quiet_s`: a request a
        killed sender had written to its socket is read, decoded and kept after the kill, so what
        the collector accepted is known only then. True once quiet (False at `timeout`)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                quiet = self.busy == 0 and time.monotonic() - self.answered_at >= quiet_s
            if quiet:
                return True
            time.sleep(0.05)
        return False

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/traces"


def decode(body: bytes) -> list[ReceivedSpan]:
    req = ExportTraceServiceRequest()
    req.ParseFromString(body)
    out = []
    for rs in req.resource_spans:
        resource = {a.key: _value(a.value) for a in rs.resource.attributes}
        for ss in rs.scope_spans:
            for s in ss.spans:
                out.append(ReceivedSpan(
                    name=s.name,
                    trace_id=s.trace_id.hex(),
                    span_id=s.span_id.hex(),
                    parent_span_id=s.parent_span_id.hex(),
                    attributes={a.key: _value(a.value) for a in s.attributes},
                    events=[(e.name, {a.key: _value(a.value) for a in e.attributes}) for e in s.events],
                    links=[(ln.trace_id.hex(), ln.span_id.hex()) for ln in s.links],
                    start_ns=s.start_time_unix_nano,
                    end_ns=s.end_time_unix_nano,
                    status_code=s.status.code,
                    resource=resource,
                ))
    return out


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_POST(self) -> None:  # noqa: N802
        rec = self.server.receiver
        with rec.lock:
            rec.busy += 1
        try:
            self._post(rec)
        finally:
            with rec.lock:
                rec.busy -= 1
                rec.answered_at = time.monotonic()

    def _post(self, rec: Receiver) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if rec.delay_s:
            time.sleep(rec.delay_s)
        try:
            spans = decode(body)
        except Exception:
            self._reply(400, b"undecodable")
            return
        with rec.lock:
            rec.requests += 1
            if rec.fail_status is not None:
                rec.failed += 1
                self._reply(rec.fail_status, b"outage")
                return
            if any(s.attributes.get("gen_ai.conversation.id") in rec.reject_runs for s in spans):
                rec.rejected += 1
                self._reply(400, b"span rejected by validation")
                return
            rec.received += len(spans)
            if rec.keep:
                rec.spans.extend(spans)
        self._reply(200, ExportTraceServiceResponse().SerializeToString(), "application/x-protobuf")

    def do_GET(self) -> None:  # noqa: N802 (stdlib naming)
        # /count: spans accepted so far (for a receiver running in another process)
        self._reply(200, str(self.server.receiver.received).encode())

    def _reply(self, code: int, body: bytes, ctype: str = "text/plain") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    receiver: Receiver


class RunningReceiver:
    def __init__(self, port: int = 0, reject_runs: set[str] | None = None, keep: bool = True) -> None:
        self.httpd = _Server(("127.0.0.1", port), _Handler)
        self.receiver = Receiver(self.httpd.server_address[1], set(reject_runs or ()), keep=keep)
        self.httpd.receiver = self.receiver
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)

    def __enter__(self) -> Receiver:
        return self.receiver

    def __exit__(self, *exc: Any) -> None:
        self.close()


if __name__ == "__main__":  # python -m tests.support.otlp_receiver PORT: count-only, until killed
    import sys

    rx = RunningReceiver(int(sys.argv[1]), keep=False)
    print(rx.receiver.endpoint, flush=True)
    rx.thread.join()
