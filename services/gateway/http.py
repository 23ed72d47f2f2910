"""The gateway's HTTP/1.1 protocol for uvicorn: httptools (llhttp, C) when installed, else h11.

Why httptools: with group commit (writer.py) the gateway's own cost per request is mostly HTTP
parsing and framing; uvicorn on httptools served 1.5-2x the one-entry requests/s of h11 in the
same run here (``python bench/gateway.py --requests``, docs/gateway.md).

What httptools lacks is a bound on a request's head: uvicorn's ``h11_max_incomplete_event_size``
is for h11 only, and httptools keeps growing the URL or a header value a client never ends. This
protocol counts the bytes of a head still incomplete and, past ``MAX_HEAD_BYTES``, answers 431 and
closes the connection (the memory a trickled or endless head costs stays under one read plus the
bound). A head is counted from the end of the previous message (or the connection's start) until
its headers are complete; a read that carries a head's end and body bytes resets the count, so a
large body is never mistaken for a large head.

Neither uvicorn protocol bounds a head in *time*: a connection that never sends a byte, or
trickles its headers, holds a slot of ``GATEWAY_MAX_CONNECTIONS`` for ever (uvicorn's keep-alive
timer runs only after a response, and stops at the next byte). Here a head must be complete within
``head_timeout_s`` (the gateway passes ``GATEWAY_BODY_TIMEOUT_S``, the bound a body already has)
from the connection's start or from its first byte after a response; past it: 408 and closed.
"""

from __future__ import annotations

from typing import Any

MAX_HEAD_BYTES = 64 * 1024  # the request line and headers of one request (also h11's bound)


def _refuse(transport: Any, status: bytes, reason: bytes) -> None:
    if not transport.is_closing():
        transport.write(b"HTTP/1.1 %b\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: %d\r\n"
                        b"connection: close\r\n\r\n%b" % (status, len(reason), reason))
        transport.close()


def protocol_class(head_timeout_s: float) -> Any:
    """uvicorn's ``http`` option: the bounded httptools protocol, or "h11" when httptools is absent."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        return "h11"

    class BoundedHttpToolsProtocol(HttpToolsProtocol):
        _head_open = True  # bytes now belong to a request head not yet complete
        _head_bytes = 0
        _head_timer: Any = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._start_head_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_head_timer()
            super().connection_lost(exc)

        def _start_head_timer(self) -> None:
            if self._head_timer is None:
                self._head_timer = self.loop.call_later(head_timeout_s, self._head_timed_out)

        def _stop_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timed_out(self) -> None:
            self._head_timer = None
            if self._head_open:
                _refuse(self.transport, b"408 Request Timeout", b"the request head did not arrive in time")

        def data_received(self, data: bytes) -> None:
            if self._head_open:
                self._head_bytes += len(data)
                self._start_head_timer()
            super().data_received(data)
            if self._head_open and self._head_bytes > MAX_HEAD_BYTES:
                _refuse(self.transport, b"431 Request Header Fields Too Large", b"request line and headers too large")

        def on_headers_complete(self) -> None:
            self._head_open = False
            self._head_bytes = 0
            self._stop_head_timer()
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._head_open = True

    return BoundedHttpToolsProtocol
