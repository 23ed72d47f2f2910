"""A small real HTTP proxy on loopback for the tests: CONNECT tunnels and absolute-form forwarding.

It is a proxy, not a stand-in for the gateway: every byte goes on to the real server named in the
request, and the proxy records what passed through it (method, target, whether it carried
``Proxy-Authorization``) so a test can show that a client used it -- or, with ``no_proxy``, did not.

- ``CONNECT host:port``: answers 200 and relays bytes both ways until one side closes (what an
  https:// client does: TLS runs end to end inside the tunnel).
- ``POST http://host:port/path``: each request of a kept-alive client connection is read whole
  (Content-Length bodies only, which is what the tap sends), sent to the origin in origin-form on
  a connection of its own, and the answer relayed with its status, headers and body.
"""

from __future__ import annotations

import contextlib
import http.client
import select
import socket
import threading
from dataclasses import dataclass, field
from urllib.parse import urlsplit


@dataclass(frozen=True)
class Passed:
    method: str
    target: str  # "host:port" for CONNECT, the absolute URL otherwise
    authorized: bool  # a Proxy-Authorization header came with it


@dataclass
class HttpProxy:
    host: str = "127.0.0.1"
    port: int = 0
    passed: list[Passed] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._sock = socket.create_server((self.host, self.port))
        self.port = self._sock.getsockname()[1]
        self._stop = False
        self._thread = threading.Thread(target=self._accept, name="http-proxy", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def close(self) -> None:
        self._stop = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()

    def __enter__(self) -> HttpProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ serving
    def _accept(self) -> None:
        while not self._stop:
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        conn = _Conn(client)
        try:
            while True:
                head = conn.read_head()
                if head is None:
                    return
                method, target, headers = head
                self.passed.append(Passed(method, target, "proxy-authorization" in headers))
                if method == "CONNECT":
                    self._tunnel(conn, target)
                    return
                body = conn.read_exactly(int(headers.get("content-length", "0")))
                self._forward(client, method, target, headers, body)
        except (OSError, ValueError):
            return
        finally:
            client.close()

    def _tunnel(self, conn: _Conn, target: str) -> None:
        client = conn.sock
        host, _, port = target.rpartition(":")
        try:
            upstream = socket.create_connection((host, int(port)), timeout=10)
        except OSError:
            client.sendall(b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\n\r\n")
            return
        client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        with upstream:
            if conn.buf:  # bytes the client sent right after the CONNECT head
                upstream.sendall(bytes(conn.buf))
            socks = [client, upstream]
            while True:
                ready, _, _ = select.select(socks, [], [], 30)
                if not ready:
                    return
                for s in ready:
                    data = s.recv(65536)
                    if not data:
                        return
                    (upstream if s is client else client).sendall(data)

    def _forward(self, client: socket.socket, method: str, target: str, headers: dict[str, str], body: bytes) -> None:
        parts = urlsplit(target)
        conn = http.client.HTTPConnection(parts.hostname or "", parts.port or 80, timeout=30)
        try:
            skip = {"proxy-authorization", "proxy-connection", "connection", "keep-alive", "host"}
            conn.request(method, parts.path + (f"?{parts.query}" if parts.query else ""), body=body,
                         headers={k: v for k, v in headers.items() if k not in skip} | {"Host": parts.netloc})
            resp = conn.getresponse()
            data = resp.read()
        except OSError:
            client.sendall(b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\n\r\n")
            return
        finally:
            conn.close()
        out = [f"HTTP/1.1 {resp.status} {resp.reason}\r\n".encode()]
        for k, v in resp.getheaders():
            if k.lower() not in ("content-length", "connection", "transfer-encoding", "keep-alive"):
                out.append(f"{k}: {v}\r\n".encode())
        out.append(f"content-length: {len(data)}\r\n\r\n".encode())
        client.sendall(b"".join(out) + data)


class _Conn:
    """A client socket with its read buffer (a head is read up to its blank line, no further)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()

    def _fill(self) -> bool:
        data = self.sock.recv(65536)
        self.buf += data
        return bool(data)

    def read_head(self) -> tuple[str, str, dict[str, str]] | None:
        """The request line and headers (names lower-cased), or None when the client closed."""
        while b"\r\n\r\n" not in self.buf:
            if len(self.buf) > 65536 or not self._fill():
                return None
        raw, _, rest = bytes(self.buf).partition(b"\r\n\r\n")
        self.buf = bytearray(rest)
        lines = raw.decode("latin-1").split("\r\n")
        method, target, _ = lines[0].split(" ", 2)
        headers = {}
        for h in lines[1:]:
            name, _, value = h.partition(":")
            headers[name.strip().lower()] = value.strip()
        return method, target, headers

    def read_exactly(self, n: int) -> bytes:
        while len(self.buf) < n:
            if not self._fill():
                raise ValueError("the client closed within a body")
        out, self.buf = bytes(self.buf[:n]), self.buf[n:]
        return out
