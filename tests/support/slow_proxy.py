"""A TCP proxy on loopback that makes a server slow or unreachable on demand (for PostgreSQL).

`delay_s` holds every chunk a client sends for that long before passing it on, so each request
and reply round trip of the protocol costs at least `delay_s` (a slow database, a congested
link). With `only` set, just the chunks that contain those bytes are held (one command of a
protocol: b"PING" for Redis). The proxy itself never buffers beyond one chunk, never drops bytes, and closes both sides
when either closes.
"""

from __future__ import annotations

import socket
import threading
import time


class SlowProxy:
    def __init__(self, target_port: int, delay_s: float = 0.0, target_host: str = "127.0.0.1",
                 only: bytes | None = None) -> None:
        self.target = (target_host, target_port)
        self.delay_s = delay_s
        self.only = only
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.requests = 0  # client chunks forwarded (each one delayed)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            threading.Thread(target=self._pipe, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, False), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, delayed: bool) -> None:
        try:
            while True:
                chunk = src.recv(65536)
                if not chunk:
                    break
                if delayed and self.delay_s and (self.only is None or self.only in chunk):
                    self.requests += 1
                    time.sleep(self.delay_s)
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def close(self) -> None:
        self._closed.set()
        self.listener.close()
