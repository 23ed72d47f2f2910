"""A loopback HTTP proxy in front of the S3 test server (moto) that can refuse or slow requests.

moto's own credential checking (INITIAL_NO_AUTH_ACTION_COUNT) refuses even valid signatures in
server mode here (SignatureDoesNotMatch for boto3 as for obstore), so a permission error cannot
come from moto itself: this proxy answers writes with the reply real S3 gives when a bucket policy
or IAM denies them (403, an `AccessDenied` XML body). Everything else passes through unchanged, so
the client code under test talks the real S3 protocol to moto. `delay_s` makes every request slow.
"""

from __future__ import annotations

import http.client
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ACCESS_DENIED = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>AccessDenied</Code>'
                 b"<Message>Access Denied</Message><RequestId>TEST</RequestId></Error>")


class S3Proxy:
    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.deny_writes = False
        self.delay_s = 0.0
        self.requests = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _handle(self) -> None:
                proxy.requests += 1
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                if proxy.delay_s:
                    threading.Event().wait(proxy.delay_s)
                if proxy.deny_writes and self.command in ("PUT", "POST", "DELETE"):
                    self.send_response(403)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(ACCESS_DENIED)))
                    self.end_headers()
                    self.wfile.write(ACCESS_DENIED)
                    return
                conn = http.client.HTTPConnection("127.0.0.1", proxy.upstream_port, timeout=60)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection",)}
                    conn.request(self.command, self.path, body=body, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                finally:
                    conn.close()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = int(self.httpd.server_address[1])
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
