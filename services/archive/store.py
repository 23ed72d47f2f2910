"""The archive's object store: where segments go (`file:///dir` or `s3://bucket/prefix`).

Through `obstore` (Rust's `object_store` crate: the S3, GCS, Azure and local back ends of
arrow-rs/DataFusion), chosen for one client for every back end, whole-object puts that are atomic
(a local put writes a temporary file and renames it; an S3 PutObject is visible whole or not at all),
and speed (no per-request Python). See docs/archive.md for the decision.

S3 settings come from the standard AWS_* variables (AWS_ENDPOINT_URL, AWS_REGION,
AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_ALLOW_HTTP), which obstore reads
itself, or from GOOSE_INGEST_ARCHIVE_ENDPOINT / _REGION. A plain http:// endpoint is allowed
(a store on loopback or inside a cluster network); an https:// one is verified as usual.

Every failure becomes `StoreError` with one line that names what and where, never a credential;
`check()` at start turns the ones a restart cannot fix (no such bucket, credentials refused, not an
S3 endpoint) into `ConfigError` (exit 2, one line).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

import obstore
from obstore import exceptions as obx
from obstore.store import LocalStore, S3Store

from services.settings import ConfigError, Settings

if TYPE_CHECKING:
    from obstore.store import S3Config

WRITE_CHECK_KEY = "_goose-ingest/write-check"  # outside raw/, events/, runs/: no reader takes it for data


Keys = list[str]  # (a method of ArchiveStore is named `list`)


class StoreError(Exception):
    """A store operation failed (one line: what, where, why). `permanent` when retrying cannot help
    (credentials refused, bucket missing) so readiness can say so."""

    def __init__(self, message: str, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


@dataclass(frozen=True)
class StoreUrl:
    scheme: str  # "file" or "s3"
    location: str  # the directory (file) or the bucket (s3)
    prefix: str  # the key prefix inside the bucket ("" for file)

    def describe(self) -> str:
        return f"file://{self.location}" if self.scheme == "file" else f"s3://{self.location}/{self.prefix}".rstrip("/")


def parse_store_url(url: str) -> StoreUrl:
    """`file:///abs/dir` or `s3://bucket[/prefix]`; ConfigError (one line) for anything else."""
    parts = urlsplit(url.strip())
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise ConfigError(f"GOOSE_INGEST_ARCHIVE_URL {url!r}: a file URL needs an absolute path (file:///dir)")
        path = unquote(parts.path).rstrip("/") or "/"
        return StoreUrl("file", path, "")
    if parts.scheme == "s3":
        if not parts.netloc or parts.query or parts.fragment or "@" in parts.netloc:
            raise ConfigError(f"GOOSE_INGEST_ARCHIVE_URL {url!r}: expected s3://bucket/prefix")
        return StoreUrl("s3", parts.netloc, parts.path.strip("/"))
    raise ConfigError(
        f"GOOSE_INGEST_ARCHIVE_URL {url!r}: unsupported scheme {parts.scheme or '(none)'!r} (use file:///dir or s3://bucket/prefix)"
    )


_S3_CODE = re.compile(r"<Code>([^<]{1,80})</Code>")
_S3_MESSAGE = re.compile(r"<Message>([^<]{1,200})</Message>")
_STATUS = re.compile(r"status code: (\d{3})")
# S3 error codes a retry cannot fix (the operator must): readiness says so, `check` exits 2.
BUCKET_MISSING = frozenset({"NoSuchBucket"})
REFUSED = frozenset({
    "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken",
    "AllAccessDisabled", "AccountProblem", "InvalidSecurity", "AuthorizationHeaderMalformed",
})  # fmt: skip


def _one_line(exc: BaseException) -> str:
    """What went wrong in one short line. obstore's messages are multi-line with a debug dump and
    the whole response body: keep the S3 error code and message when there is one, the HTTP status
    or the transport failure otherwise. Never the request's headers (they carry the signature)."""
    text = " ".join(str(exc).split())
    code = _S3_CODE.search(text)
    if code is not None:
        message = _S3_MESSAGE.search(text)
        return f"{code.group(1)}: {message.group(1)}" if message else code.group(1)
    if "error sending request" in text or "connection" in text.lower():
        return "connection failed (" + text.split(" - ", 1)[-1].split(" Debug source")[0][:160] + ")"
    status = _STATUS.search(text)
    if status is not None:
        return f"HTTP {status.group(1)} from the endpoint, not an S3 answer"
    return text.split(" Debug source")[0][:240]


def _code(exc: BaseException) -> str | None:
    found = _S3_CODE.search(str(exc))
    return found.group(1) if found else None


def _classify(exc: BaseException, what: str, where: str) -> StoreError:
    code = _code(exc)
    if isinstance(exc, obx.PermissionDeniedError | obx.UnauthenticatedError) or code in REFUSED:
        return StoreError(f"{what} {where}: credentials refused or not allowed ({_one_line(exc)})", permanent=True)
    if code in BUCKET_MISSING:
        return StoreError(f"{what} {where}: bucket not found", permanent=True)
    if isinstance(exc, obx.NotFoundError):
        return StoreError(f"{what} {where}: not found")
    return StoreError(f"{what} {where}: {_one_line(exc)}")


class ArchiveStore:
    """put / get / list over one store; keys are relative to the URL's prefix."""

    def __init__(self, url: StoreUrl, store: Any) -> None:
        self.url = url
        self._store = store

    def describe(self) -> str:
        return self.url.describe()

    def put(self, key: str, data: bytes) -> None:
        """Write the object whole (atomic: readers see the old object, or the new one, never a part)."""
        try:
            obstore.put(self._store, key, data, use_multipart=False)
        except Exception as exc:  # obstore raises its own and builtin errors (timeouts: OSError)
            raise _classify(exc, "writing", self._where(key)) from None

    def create(self, key: str, data: bytes) -> bool:
        """Write the object whole only if no object of that name exists (a create-only put: S3's
        `If-None-Match: *`, a no-clobber link on a local store). True if this call created it, False
        if it existed already: an archived object is never replaced (docs/archive.md "Guarantees")."""
        try:
            obstore.put(self._store, key, data, use_multipart=False, mode="create")
        except obx.AlreadyExistsError:
            return False
        except Exception as exc:
            if "PreconditionFailed" in str(exc) or "412" in str(exc).split("Debug source")[0]:
                return False  # an S3 service that answers If-None-Match with 412 in a form obstore does not map
            raise _classify(exc, "writing", self._where(key)) from None
        return True

    def get(self, key: str) -> bytes:
        try:
            return bytes(obstore.get(self._store, key).bytes())
        except Exception as exc:
            raise _classify(exc, "reading", self._where(key)) from None

    def exists(self, key: str) -> bool:
        try:
            obstore.head(self._store, key)
        except (obx.NotFoundError, FileNotFoundError):  # obstore raises the builtin for a missing object
            return False
        except Exception as exc:
            raise _classify(exc, "looking up", self._where(key)) from None
        return True

    def list(self, prefix: str = "") -> list[str]:
        """Every key under `prefix` (a path prefix: `raw/date=2026-12-03`), sorted."""
        keys: list[str] = []
        try:
            for chunk in obstore.list(self._store, prefix or None, chunk_size=1000):
                keys.extend(str(meta["path"]) for meta in chunk)
        except Exception as exc:
            raise _classify(exc, "listing", self._where(prefix)) from None
        return sorted(keys)

    def list_after(self, prefix: str, since_date: str | None) -> Keys:
        """Every key under `prefix` (`raw/`) in the `date=` folders from `since_date` on (None: all),
        sorted: one delimiter listing of the folders, then the chosen ones."""
        if since_date is None:
            return self.list(prefix)
        try:
            folders = obstore.list_with_delimiter(self._store, prefix)["common_prefixes"]
        except Exception as exc:
            raise _classify(exc, "listing", self._where(prefix)) from None
        keys: Keys = []
        for folder in sorted(str(f) for f in folders):
            name = folder.rstrip("/").rsplit("/", 1)[-1]
            if not name.startswith("date=") or name[5:] >= since_date:
                keys.extend(self.list(folder.rstrip("/") + "/"))
        return sorted(keys)

    def delete(self, key: str) -> None:
        try:
            obstore.delete(self._store, key)
        except obx.NotFoundError:
            return
        except Exception as exc:
            raise _classify(exc, "deleting", self._where(key)) from None

    def probe(self) -> None:
        """One cheap request (a LIST of at most one key): StoreError when the store does not answer."""
        try:
            for _ in obstore.list(self._store, None, chunk_size=1):
                break
        except Exception as exc:
            raise _classify(exc, "listing", self.describe()) from None

    def check(self) -> None:
        """Start-up check: the store answers as an object store, lets us list and write (one small
        object, WRITE_CHECK_KEY). ConfigError (one line) for what a restart cannot fix: a bucket that
        does not exist, credentials refused for listing or writing, an endpoint that does not speak
        S3; StoreError for the rest (unreachable: worth retrying)."""
        try:
            for _ in obstore.list(self._store, None, chunk_size=1):
                break
        except Exception as exc:
            code = _code(exc)
            if code in BUCKET_MISSING or (code is None and isinstance(exc, obx.NotFoundError)):
                raise ConfigError(f"archive store {self.describe()}: bucket not found") from None
            if code in REFUSED or isinstance(exc, obx.PermissionDeniedError | obx.UnauthenticatedError):
                raise ConfigError(f"archive store {self.describe()}: credentials refused ({_one_line(exc)})") from None
            text = _one_line(exc)
            if text.startswith("connection failed") or isinstance(exc, OSError | TimeoutError):
                raise StoreError(f"archive store {self.describe()}: unreachable ({text})") from None
            raise ConfigError(f"archive store {self.describe()}: not an S3 endpoint or refused the listing ({text})") from None
        # Listing is not writing: a read-only credential or a policy without s3:PutObject would
        # otherwise only show at the first cut, minutes later. One small object, rewritten each start.
        try:
            obstore.put(self._store, WRITE_CHECK_KEY, b"goose-ingest archive write check\n", use_multipart=False)
        except Exception as exc:
            code = _code(exc)
            if code in REFUSED or isinstance(exc, obx.PermissionDeniedError | obx.UnauthenticatedError):
                raise ConfigError(f"archive store {self.describe()}: writing refused ({_one_line(exc)})") from None
            raise _classify(exc, "writing", self._where(WRITE_CHECK_KEY)) from None

    def _where(self, key: str) -> str:
        return f"{self.describe()}/{key}" if key else self.describe()


def open_store(settings: Settings, environ: dict[str, str] | None = None) -> ArchiveStore | None:
    """The store GOOSE_INGEST_ARCHIVE_URL names, or None when it is unset. ConfigError (one line)
    for a URL that is not file:///dir or s3://bucket/prefix."""
    if not settings.archive_url:
        return None
    url = parse_store_url(settings.archive_url)
    env = os.environ if environ is None else environ
    timeout = timedelta(seconds=settings.archive_store_timeout_s)
    if url.scheme == "file":
        try:
            os.makedirs(url.location, exist_ok=True)
            store: Any = LocalStore(url.location, mkdir=True)
        except Exception as exc:
            raise ConfigError(f"archive store {url.describe()}: {_one_line(exc)}") from None
        return ArchiveStore(url, store)
    endpoint = settings.archive_endpoint or env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    config: S3Config = {}
    if endpoint:
        if not endpoint.startswith(("http://", "https://")):
            raise ConfigError(f"archive S3 endpoint {endpoint!r}: expected an http:// or https:// URL")
        config["endpoint"] = endpoint
    region = settings.archive_region or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    if region:
        config["region"] = region
    allow_http = bool(endpoint and endpoint.startswith("http://")) or env.get("AWS_ALLOW_HTTP", "").lower() in ("1", "true")
    try:
        store = S3Store(
            url.location,
            prefix=url.prefix or None,
            config=config,
            client_options={"allow_http": allow_http, "timeout": timeout, "connect_timeout": timedelta(seconds=5)},
            retry_config={"max_retries": 2, "retry_timeout": timeout,
                          "backoff": {"init_backoff": timedelta(milliseconds=100), "max_backoff": timedelta(seconds=2), "base": 2}},
        )
    except Exception as exc:
        raise ConfigError(f"archive store {url.describe()}: {_one_line(exc)}") from None
    return ArchiveStore(url, store)
