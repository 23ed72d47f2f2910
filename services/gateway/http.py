"""The gateway's HTTP/1.1 protocol for uvicorn: httptools (llhttp, C) when installed, else h11.

Why httptools: with group commit (writer.py) the gateway's own cost per request is mostly HTTP
parsing and framing; uvicorn on httptools served about twice the one-entry requests/s of h11 in the
same run here (``python bench/gateway.py --requests``, docs/gateway.md).

What httptools lacks is a bound on a request's head: uvicorn's ``h11_max_incomplete_event_size``
is for h11 only, and httptools keeps growing the URL or a header value a client never ends. This
protocol counts the bytes of a head still incomplete and, past ``MAX_HEAD_BYTES``, answers 431 and
closes the connection (the memory a trickled or endless head costs stays under one read plus the
bound). A head is counted from the end of the previous message (or the connection's start) until
its headers are complete; a read that carries a head's end and body bytes resets the count, so a
large body is never mistaken for a large head.
"""

from __future__ import annotations

from typing import Any

MAX_HEAD_BYTES = 64 * 1024  # the request line and headers of one request (also h11's bound)


def protocol_class() -> Any:
    """uvicorn's ``http`` option: the bounded httptools protocol, or "h11" when httptools is absent."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        return "h11"

    class BoundedHttpToolsProtocol(HttpToolsProtocol):
        _head_open = True  # bytes now belong to a request head not yet complete
        _head_bytes = 0

        def data_received(self, data: bytes) -> None:
            if self._head_open:
                self._head_bytes += len(data)
            super().data_received(data)
            if self._head_open and self._head_bytes > MAX_HEAD_BYTES and not self.transport.is_closing():
                self.transport.write(b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain; "
                                     b"charset=utf-8\r\ncontent-length: 34\r\nconnection: close\r\n\r\n"
                                     b"request line and headers too large")
                self.transport.close()

        def on_headers_complete(self) -> None:
            self._head_open = False
            self._head_bytes = 0
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._head_open = True

    return BoundedHttpToolsProtocol
