"""The tap's transport to an ingest gateway (``GOOSE_INGEST_INGEST_ENDPOINT``, docs/gateway.md).

The spool's records are already the gateway's NDJSON (raw-entry fields, ``line_b64`` for bytes that
are not UTF-8), so a batch is sent as the records it read from the spool, gzip'ed. Anything but a
2xx raises ``GatewayError`` (a ``BrokerError``): the publisher keeps the batch spooled and resends
it in order with backoff, exactly as for a broker outage. Entries the gateway refuses one by one in
a 200 (invalid, oversize) would be refused again on every resend: they count as delivered and are
reported (reason only, never the line).

stdlib only (urllib: proxies from ``https_proxy``/``http_proxy``/``no_proxy``, TLS with a CA file),
so a tap that speaks HTTP imports no HTTP client package.
"""

from __future__ import annotations

import logging
import ssl
import urllib.error
import urllib.request
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

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
    if settings.ingest_token is not None:
        token = settings.ingest_token.get_secret_value().strip()
    elif settings.ingest_token_file:
        try:
            lines = Path(settings.ingest_token_file).read_text("utf-8").splitlines()
        except OSError as exc:
            raise ConfigError(f"GOOSE_INGEST_INGEST_TOKEN_FILE: cannot read it ({exc.strerror or exc})") from None
        token = lines[0].strip() if lines else ""
    else:
        raise ConfigError("GOOSE_INGEST_INGEST_ENDPOINT is set but neither GOOSE_INGEST_INGEST_TOKEN nor "
                          "GOOSE_INGEST_INGEST_TOKEN_FILE is")
    if not token or not token.isprintable() or " " in token:
        raise ConfigError("the gateway token (GOOSE_INGEST_INGEST_TOKEN[_FILE]) is empty or malformed")
    return token


def endpoint_url(settings: Settings) -> str:
    base = (settings.ingest_endpoint or "").rstrip("/")
    if not base.startswith(("https://", "http://")):
        raise ConfigError("GOOSE_INGEST_INGEST_ENDPOINT must be an https:// (or http://) URL")
    return base if base.endswith(INGEST_PATH) else base + INGEST_PATH


class HttpTransport:
    def __init__(self, settings: Settings) -> None:
        self.url = endpoint_url(settings)
        self._auth = f"Bearer {read_token(settings)}"
        handlers: list[Any] = [urllib.request.ProxyHandler()]  # the standard *_proxy variables
        if self.url.startswith("https://"):
            try:
                ctx = ssl.create_default_context(cafile=settings.ingest_ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(f"GOOSE_INGEST_INGEST_CA_FILE: cannot load it ({exc})") from None
            handlers.append(urllib.request.HTTPSHandler(context=ctx))
        self._opener = urllib.request.build_opener(*handlers)
        self.refused = 0  # entries the gateway refused for good (reported, not resent)

    def send(self, raws: list[bytes]) -> None:
        """POST spool records (NDJSON lines) as one batch; return once the gateway stored them."""
        body = b"".join(r if SRC_TAG.encode() not in r else _without_src(r) for r in raws)
        headers = {"Content-Type": "application/x-ndjson", "Authorization": self._auth}
        if len(body) >= GZIP_FROM_BYTES:
            c = zlib.compressobj(1, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
            body = c.compress(body) + c.flush()
            headers["Content-Encoding"] = "gzip"
        req = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        try:
            with self._opener.open(req, timeout=TIMEOUT_S) as resp:
                reply = resp.read()
        except urllib.error.HTTPError as exc:
            reason = ""
            try:
                reason = str(orjson.loads(exc.read(4096)).get("reason", ""))[:200]
            except Exception:
                pass
            retry = exc.headers.get("Retry-After", "") if exc.headers else ""
            raise GatewayError(f"gateway answered {exc.code}" + (f": {reason}" if reason else "")
                               + (f" (retry after {retry} s)" if retry else "")) from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            why = getattr(exc, "reason", None) or exc
            raise GatewayError(f"gateway unreachable ({type(exc).__name__}: {why})") from None
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
        pass


def _without_src(raw: bytes) -> bytes:
    rec = orjson.loads(raw)
    rec.pop(SRC_TAG, None)
    return orjson.dumps(rec, option=orjson.OPT_APPEND_NEWLINE)
