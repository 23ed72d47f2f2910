"""The tap's transport to an ingest gateway (``GOOSE_INGEST_ENDPOINT``, docs/gateway.md).

The spool's records are already the gateway's NDJSON (raw-entry fields, ``line_b64`` for bytes that
are not UTF-8), so a batch is sent as the records it read from the spool, gzip'ed. Anything but a
2xx raises ``GatewayError`` (a ``BrokerError``): the publisher keeps the batch spooled and resends
it in order with backoff, exactly as for a broker outage. Entries the gateway refuses one by one in
a 200 (invalid, oversize) would be refused again on every resend: they count as delivered and are
reported (reason only, never the line).

stdlib only (http.client on one kept-alive connection; proxies from ``https_proxy``/``http_proxy``/
``no_proxy`` as urllib reads them, CONNECT for https; TLS with a CA file), so a tap that speaks HTTP
imports no HTTP client package.
"""

from __future__ import annotations

import base64
import http.client
import logging
import socket
import ssl
import urllib.request
import zlib
from collections import Counter
from pathlib import Path
from urllib.parse import unquote, urlsplit

import orjson

from contracts.gateway import INGEST_PATH
from services.settings import ConfigError, Settings
from services.tap.conn import BrokerError
from services.tap.spool import SRC_TAG

log = logging.getLogger("goose_ingest.tap")

TIMEOUT_S = 10.0
GZIP_FROM_BYTES = 1024  # smaller batches go uncompressed (the header would cost more than it saves)


class GatewayError(BrokerError):
    """The gateway did not take the batch (non-2xx, or unreachable): retry later."""


def read_token(settings: Settings) -> str:
    if settings.token is not None:
        token = settings.token.get_secret_value().strip()
    elif settings.token_file:
        try:
            lines = Path(settings.token_file).read_text("utf-8").splitlines()
        except OSError as exc:
            raise ConfigError(f"GOOSE_INGEST_TOKEN_FILE: cannot read it ({exc.strerror or exc})") from None
        token = lines[0].strip() if lines else ""
    else:
        raise ConfigError("GOOSE_INGEST_ENDPOINT is set but neither GOOSE_INGEST_TOKEN nor "
                          "GOOSE_INGEST_TOKEN_FILE is")
    if not token or not token.isprintable() or " " in token:
        raise ConfigError("the gateway token (GOOSE_INGEST_TOKEN[_FILE]) is empty or malformed")
    return token


def endpoint_url(settings: Settings) -> str:
    base = (settings.endpoint or "").rstrip("/")
    if not base.startswith(("https://", "http://")):
        raise ConfigError("GOOSE_INGEST_ENDPOINT must be an https:// (or http://) URL")
    return base if base.endswith(INGEST_PATH) else base + INGEST_PATH


class HttpTransport:
    """One kept-alive connection to the gateway (through the environment's proxy, if any), used by the
    publisher's sender thread only."""

    def __init__(self, settings: Settings) -> None:
        self.url = endpoint_url(settings)
        self._auth = f"Bearer {read_token(settings)}"
        parts = urlsplit(self.url)
        self._https = parts.scheme == "https"
        self._host = parts.hostname or ""
        try:
            self._port = parts.port or (443 if self._https else 80)
        except ValueError:
            raise ConfigError("GOOSE_INGEST_ENDPOINT has an invalid port") from None
        self._path = parts.path
        self._ctx: ssl.SSLContext | None = None
        if self._https:
            try:
                self._ctx = ssl.create_default_context(cafile=settings.endpoint_ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(f"GOOSE_INGEST_ENDPOINT_CA_FILE: cannot load it ({exc})") from None
        # the standard https_proxy / http_proxy / no_proxy variables, read as urllib reads them
        proxy = urllib.request.getproxies().get(parts.scheme)
        self._proxy = urlsplit(proxy) if proxy and not urllib.request.proxy_bypass(self._host) else None
        self._conn: http.client.HTTPConnection | None = None
        self._target = self._path
        self._extra: dict[str, str] = {}
        self.refused = 0  # entries the gateway refused for good (reported, not resent)

    def _connect(self) -> tuple[http.client.HTTPConnection, str, dict[str, str]]:
        """A new connection, the request target and any proxy header."""
        extra: dict[str, str] = {}
        if self._proxy is None:
            if self._https:
                return http.client.HTTPSConnection(self._host, self._port, timeout=TIMEOUT_S, context=self._ctx), self._path, extra
            return http.client.HTTPConnection(self._host, self._port, timeout=TIMEOUT_S), self._path, extra
        p = self._proxy
        if p.username:
            basic = base64.b64encode(f"{unquote(p.username)}:{unquote(p.password or '')}".encode()).decode()
            extra["Proxy-Authorization"] = f"Basic {basic}"
        if self._https:  # CONNECT through the proxy, TLS to the gateway inside the tunnel
            tunnel = http.client.HTTPSConnection(p.hostname or "", p.port or 3128, timeout=TIMEOUT_S, context=self._ctx)
            tunnel.set_tunnel(self._host, self._port, headers=extra)
            return tunnel, self._path, {}
        conn = http.client.HTTPConnection(p.hostname or "", p.port or 3128, timeout=TIMEOUT_S)
        return conn, self.url, extra  # absolute-form target for a plain-HTTP proxy

    def send(self, raws: list[bytes]) -> None:
        """POST spool records (NDJSON lines) as one batch; return once the gateway stored them."""
        body = b"".join(r if SRC_TAG.encode() not in r else _without_src(r) for r in raws)
        headers = {"Content-Type": "application/x-ndjson", "Authorization": self._auth}
        if len(body) >= GZIP_FROM_BYTES:
            c = zlib.compressobj(1, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
            body = c.compress(body) + c.flush()
            headers["Content-Encoding"] = "gzip"
        for attempt in (0, 1):
            reused = self._conn is not None
            try:
                if self._conn is None:
                    self._conn, self._target, self._extra = self._connect()
                    self._conn.connect()
                    if self._conn.sock is not None:  # head and body are two writes: no Nagle delay between
                        self._conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                conn = self._conn
                conn.request("POST", self._target, body=body, headers={**headers, **self._extra})
                resp = conn.getresponse()
                reply = resp.read()
            except (http.client.HTTPException, OSError) as exc:
                self.close()
                if reused and attempt == 0:
                    continue  # the gateway closed the idle kept-alive connection: once more on a new one
                raise GatewayError(f"gateway unreachable ({type(exc).__name__}: {exc})") from None
            if resp.will_close:
                self.close()
            break
        if not 200 <= resp.status < 300:
            reason = ""
            try:
                reason = str(orjson.loads(reply[:4096]).get("reason", ""))[:200]
            except Exception:
                pass
            retry = resp.getheader("Retry-After") or ""
            raise GatewayError(f"gateway answered {resp.status}" + (f": {reason}" if reason else "")
                               + (f" (retry after {retry} s)" if retry else ""))
        self._report(reply, len(raws))

    def _report(self, reply: bytes, sent: int) -> None:
        try:
            doc = orjson.loads(reply)
            results = doc.get("results") or []
        except (orjson.JSONDecodeError, AttributeError):
            return  # stored (2xx) is what counts; an unreadable report is not worth a resend
        reasons = Counter(r.get("reason", "?") for r in results if isinstance(r, dict) and not r.get("stored", True))
        if reasons:
            self.refused += sum(reasons.values())
            log.warning("the gateway refused %d of %d entries for good (%s); the others are stored",
                        sum(reasons.values()), sent, ", ".join(f"{k}: {v}" for k, v in sorted(reasons.items())))

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _without_src(raw: bytes) -> bytes:
    rec = orjson.loads(raw)
    rec.pop(SRC_TAG, None)
    return orjson.dumps(rec, option=orjson.OPT_APPEND_NEWLINE)
