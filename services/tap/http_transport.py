"""The tap's transport to an ingest gateway (``GOOSE_INGEST_ENDPOINT``, docs/gateway.md).

The spool's records are already the gateway's NDJSON (raw-entry fields, ``line_b64`` for bytes that
are not UTF-8), so a batch is sent as the records it read from the spool, gzip'ed, in bodies cut by
bytes below the gateway's announced limit (``send``). An outage (unreachable, 429, 5xx) raises
``GatewayError`` (a ``BrokerError``): the publisher keeps the batch spooled and resends it in order
with backoff, as for a broker outage, after the gateway's Retry-After when it gave one. A refusal of
the token, the run key or the endpoint (401/403/404) raises ``GatewayRefused``, logged as what it
is. Entries the gateway refuses one by one (in a 200, or a body of one entry answered 400/413)
would be refused again on every resend: they count as delivered and are reported (reason only,
never the line).

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

from contracts.gateway import INGEST_PATH, MAX_BODY_HEADER, MAX_ENTRY_HEADER, TOKEN_PATH
from services.settings import ConfigError, Settings
from services.tap.conn import BrokerError
from services.tap.spool import SRC_TAG, keep_refused

log = logging.getLogger("goose_ingest.tap")

TIMEOUT_S = 10.0
GZIP_FROM_BYTES = 1024  # smaller batches go uncompressed (the header would cost more than it saves)
# A body's bytes (NDJSON, before gzip) until the gateway announced its limit (MAX_BODY_HEADER): below
# the gateway's default, so the first batch after an outage is not refused whole (a smaller configured
# limit is learnt from the 413, whose body is then split).
DEFAULT_MAX_BODY = 4 << 20
RETRY_AFTER_CAP_S = 60  # a Retry-After longer than this is not waited for (the publisher's backoff applies)


class GatewayError(BrokerError):
    """The gateway did not take the batch now (unreachable, 429, 5xx): retry later, after
    ``retry_after`` seconds when it said so."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class GatewayRefused(GatewayError):
    """The gateway refuses ``what`` (the token: 401, the run key: 403, the endpoint: 404): no outage --
    resending helps only once someone fixes it. The entries stay spooled."""

    def __init__(self, message: str, what: str) -> None:
        super().__init__(message)
        self.what = what


def _reason(reply: bytes) -> str:
    try:
        return str(orjson.loads(reply[:4096]).get("reason", ""))[:200]
    except Exception:
        return ""


def _seq_of(raw: bytes) -> str:
    try:
        return str(orjson.loads(raw).get("seq", "?"))
    except Exception:
        return "?"


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
        self._settings = settings
        self.timeout = TIMEOUT_S  # connect and each read (a start-up check uses a shorter one)
        self._token: str | None = read_token(settings)  # None: read again (after a 401)
        self.max_body = min(DEFAULT_MAX_BODY, settings.gateway_max_body_bytes)
        self.max_entry = settings.max_line_bytes
        self._partial: list[bytes] | None = None  # the batch partly stored, and how many of its records
        self._done = 0
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
        self.cut = 0  # entries kept cut (oversize), dead-lettered by the workers

    def _connect(self) -> tuple[http.client.HTTPConnection, str, dict[str, str]]:
        """A new connection, the request target and any proxy header."""
        extra: dict[str, str] = {}
        if self._proxy is None:
            if self._https:
                return http.client.HTTPSConnection(self._host, self._port, timeout=self.timeout, context=self._ctx), self._path, extra
            return http.client.HTTPConnection(self._host, self._port, timeout=self.timeout), self._path, extra
        p = self._proxy
        if p.username:
            basic = base64.b64encode(f"{unquote(p.username)}:{unquote(p.password or '')}".encode()).decode()
            extra["Proxy-Authorization"] = f"Basic {basic}"
        if self._https:  # CONNECT through the proxy, TLS to the gateway inside the tunnel
            tunnel = http.client.HTTPSConnection(p.hostname or "", p.port or 3128, timeout=self.timeout, context=self._ctx)
            tunnel.set_tunnel(self._host, self._port, headers=extra)
            return tunnel, self._path, {}
        conn = http.client.HTTPConnection(p.hostname or "", p.port or 3128, timeout=self.timeout)
        return conn, self.url, extra  # absolute-form target for a plain-HTTP proxy

    def send(self, raws: list[bytes]) -> None:
        """POST spool records (NDJSON lines); return once the gateway stored them.

        The records go in bodies cut by bytes below the gateway's announced limit (``MAX_BODY_HEADER``;
        ``DEFAULT_MAX_BODY`` until it said), an entry whose line exceeds its entry limit is sent cut
        (the gateway keeps it cut in the raw log and the workers dead-letter it, as a direct tap's).
        A body refused whole for its size or form (413, 400) is split until the one entry it cannot
        take, which is refused for good and logged: the run's later entries still go. 401/403/404
        raise ``GatewayRefused``; 429, 5xx and connection errors ``GatewayError`` (retry later).
        Bodies already stored are not resent when the publisher retries the same batch."""
        if not raws:
            self._deliver([])  # an empty body: the token's check (import-sessions)
            return
        recs = [self._prepared(r) for r in raws]
        i = self._done if self._partial is raws else 0
        while i < len(recs):
            j, size = i + 1, len(recs[i])
            cap = self.max_body
            while j < len(recs) and size + len(recs[j]) <= cap:
                size += len(recs[j])
                j += 1
            self._deliver(recs[i:j])
            i = j
            self._partial, self._done = raws, i
        self._partial, self._done = None, 0

    def _prepared(self, raw: bytes) -> bytes:
        """The record as sent: no local tag; a line over the entry limit cut to just over it.

        A JSON string is at least as long as its UTF-8 bytes (base64: 4/3 of them), so only a record
        longer than the limit can hold such a line, and only those are parsed."""
        if SRC_TAG.encode() in raw:
            raw = _without_src(raw)
        limit = self.max_entry
        if len(raw) <= limit:
            return raw
        try:
            rec = orjson.loads(raw)
            if isinstance(rec.get("line"), str):
                line = rec["line"].encode("utf-8")
                if len(line) <= limit:
                    return raw
                # cut on a character boundary, still over the limit (a character is at most 4 bytes)
                rec["line"] = line[:limit + 4].decode("utf-8", "ignore")
            elif isinstance(rec.get("line_b64"), str):
                line = base64.b64decode(rec["line_b64"])
                if len(line) <= limit:
                    return raw
                rec["line_b64"] = base64.b64encode(line[:limit + 1]).decode("ascii")
            else:
                return raw
        except (orjson.JSONDecodeError, ValueError, AttributeError):
            return raw  # the gateway says what is wrong with it
        log.warning("run %s seq %s: a line of %d bytes is over the gateway's entry limit (%d); it is sent cut and "
                    "dead-lettered oversize by the workers (the whole line stays in the spool until the run ends)",
                    rec.get("run"), rec.get("seq"), len(line), limit)
        return orjson.dumps(rec, option=orjson.OPT_APPEND_NEWLINE)

    def _deliver(self, recs: list[bytes]) -> None:
        status, reply, retry = self._post(b"".join(recs), len(recs))
        if 200 <= status < 300:
            self._report(reply, recs)
            return
        reason = _reason(reply)
        if status in (400, 413):  # this body can never be taken as it is: split it, down to the one entry
            if len(recs) > 1:
                half = len(recs) // 2
                self._deliver(recs[:half])
                self._deliver(recs[half:])
                return
            if recs:
                self.refused += 1
                seq = _seq_of(recs[0])
                kept = keep_refused(self._settings, recs[0], f"{status}: {reason}" if reason else str(status))
                log.error("the gateway refused entry seq %s for good (%d%s); kept in %s (`goose-ingest spool` "
                          "lists it), the run's later entries go on", seq, status, f": {reason}" if reason else "",
                          kept)
                return
        if status == 401:
            self._token = None  # read the token file again before the next attempt (it may be replaced)
            raise GatewayRefused(f"the gateway refused the token (401{': ' + reason if reason else ''}); "
                                 "check GOOSE_INGEST_TOKEN_FILE / GOOSE_INGEST_TOKEN", "the token")
        if status == 403:
            raise GatewayRefused(f"the gateway refused the run key (403{': ' + reason if reason else ''}); "
                                 "use a --run inside the token's prefix", "the run key")
        if status == 404:
            raise GatewayRefused(f"no ingest gateway at {self.url} (404); check GOOSE_INGEST_ENDPOINT", "the endpoint")
        raise GatewayError(f"gateway answered {status}" + (f": {reason}" if reason else "")
                           + (f" (retry after {retry:g} s)" if retry else ""), retry)

    def token_info(self) -> dict[str, object]:
        """GET the token's prefix, labels and the gateway's limits (``TOKEN_PATH``): ``GatewayRefused`` on
        401/404, ``GatewayError`` when the gateway does not answer."""
        status, reply, retry = self._request("GET", self._path_of(TOKEN_PATH), None, {})
        if status == 200:
            try:
                doc = orjson.loads(reply)
            except orjson.JSONDecodeError:
                doc = None
            if isinstance(doc, dict) and isinstance(doc.get("prefix"), str):
                return doc
            raise GatewayError("the gateway's token reply is not JSON")
        reason = _reason(reply)
        if status == 401:
            raise GatewayRefused(f"the gateway refused the token (401{': ' + reason if reason else ''}); "
                                 "check GOOSE_INGEST_TOKEN_FILE / GOOSE_INGEST_TOKEN", "the token")
        if status == 404:
            raise GatewayRefused(f"no ingest gateway at {self.url} (404); check GOOSE_INGEST_ENDPOINT", "the endpoint")
        raise GatewayError(f"gateway answered {status}" + (f": {reason}" if reason else ""), retry)

    def _path_of(self, path: str) -> str:
        return self._path[: -len(INGEST_PATH)] + path if self._path.endswith(INGEST_PATH) else path

    def _post(self, body: bytes, count: int) -> tuple[int, bytes, float | None]:
        headers = {"Content-Type": "application/x-ndjson"}
        if len(body) >= GZIP_FROM_BYTES:
            c = zlib.compressobj(1, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
            body = c.compress(body) + c.flush()
            headers["Content-Encoding"] = "gzip"
        return self._request("POST", self._path, body, headers)

    def _request(self, method: str, path: str, body: bytes | None,
                 headers: dict[str, str]) -> tuple[int, bytes, float | None]:
        """One request on the kept-alive connection: (status, reply, Retry-After seconds or None)."""
        if self._token is None:
            try:
                self._token = read_token(self._settings)
            except ConfigError as exc:
                raise GatewayRefused(str(exc), "the token") from None
        headers = {**headers, "Authorization": f"Bearer {self._token}"}
        for attempt in (0, 1):
            reused = self._conn is not None
            try:
                if self._conn is None:
                    self._conn, self._target, self._extra = self._connect()
                    self._conn.connect()
                    if self._conn.sock is not None:  # head and body are two writes: no Nagle delay between
                        self._conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                conn = self._conn
                target = self._target if path == self._path else (
                    self._target[: -len(self._path)] + path if self._target.endswith(self._path) else path)
                conn.request(method, target, body=body, headers={**headers, **self._extra})
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
        self._learn(resp)
        retry: float | None = None
        header = resp.getheader("Retry-After")
        if header and header.strip().isdigit():
            retry = float(min(int(header.strip()), RETRY_AFTER_CAP_S))
        return resp.status, reply, retry

    def _learn(self, resp: http.client.HTTPResponse) -> None:
        """The limits the gateway announces on every reply."""
        for name, attr in ((MAX_BODY_HEADER, "max_body"), (MAX_ENTRY_HEADER, "max_entry")):
            value = (resp.getheader(name) or "").strip()
            if value.isdigit() and int(value) >= 1024:
                setattr(self, attr, int(value))

    def _report(self, reply: bytes, recs: list[bytes]) -> None:
        sent = len(recs)
        try:
            doc = orjson.loads(reply)
            results = doc.get("results") or []
        except (orjson.JSONDecodeError, AttributeError):
            return  # stored (2xx) is what counts; an unreadable report is not worth a resend
        reasons = Counter(r.get("reason", "?") for r in results if isinstance(r, dict) and not r.get("stored", True))
        cut = sum(1 for r in results if isinstance(r, dict) and r.get("stored") and r.get("reason"))
        if cut:
            self.cut += cut
            log.warning("the gateway kept %d of %d entries cut (oversize): the workers dead-letter them", cut, sent)
        if reasons:
            self.refused += sum(reasons.values())
            for rec, r in zip(recs, results, strict=False):
                if isinstance(r, dict) and not r.get("stored", True):
                    keep_refused(self._settings, rec, f"{r.get('reason', '?')}: {r.get('detail', '')}")
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
