"""The ingest gateway (docs/gateway.md): a real `goose-ingest gateway` process on a real redis-server that
loads the shipped ACL roles (the gateway runs as its own `gateway` user), clients that speak plain HTTP
(urllib, http.client: no project code on the client side), a real worker and real taps."""

from __future__ import annotations

import gzip
import http.client
import logging
import os
import select
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zlib
from dataclasses import dataclass
from pathlib import Path
from uuid import uuid4

import orjson
import pytest
import redis

from contracts.gateway import ErrorReply, IngestReply
from services.broker.acl import ROLE_NAMES, render, user_name
from services.broker.embedded import EmbeddedRedis, free_port, start_redis
from services.gateway import tokens
from services.gateway.app import RateLimiter
from services.gateway.body import Accepted, BodyError, Refused, check_entry, decompress, parse
from services.settings import Settings
from tests.support.fixtures import REPO, TRANSCRIPTS
from tests.support.needs import missing
from tests.support.pipeline import expected_events, start_worker, stop, wait_until
from tests.support.redis_server import cli_env

pytestmark = pytest.mark.e2e

ROOT_USER, ROOT_PASSWORD = "test-root", f"root-{uuid4().hex}"
BOOTSTRAP_ACL = "user default on nopass ~* &* +@all\n"
FIXTURE = next(p for p in TRANSCRIPTS if p.name.startswith("a-read-edit-test-finish"))


# --- processes ------------------------------------------------------------------------------------
@dataclass
class Gateway:
    proc: subprocess.Popen
    url: str
    log: Path

    def post(self, body: bytes, token: str | None, headers: dict[str, str] | None = None,
             timeout: float = 30) -> tuple[int, dict, dict]:
        """POST /v1/raw with urllib: (status, JSON reply, headers)."""
        h = {"Content-Type": "application/x-ndjson", **(headers or {})}
        if token is not None:
            h["Authorization"] = f"Bearer {token}"
        req = urllib.request.Request(self.url + "/v1/raw", data=body, headers=h, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, orjson.loads(resp.read()), {k.lower(): v for k, v in resp.headers.items()}
        except urllib.error.HTTPError as exc:
            return exc.code, orjson.loads(exc.read() or b"{}"), {k.lower(): v for k, v in exc.headers.items()}

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=10) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def rss_hwm_kib(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
        raise AssertionError("no VmHWM")


def start_gateway(settings: Settings, log: Path, port: int | None = None, **env: str) -> Gateway:
    port = port or free_port()
    proc = subprocess.Popen([sys.executable, "-m", "services.cli", "gateway", "--host", "127.0.0.1", "--port", str(port)],
                            cwd=REPO, env=cli_env(settings, **env), stdout=log.open("ab"), stderr=subprocess.STDOUT)
    gw = Gateway(proc, f"http://127.0.0.1:{port}", log)

    def up() -> bool:
        # /healthz answers from the first second (the early probe server); the gateway itself
        # serves once it says it listens
        assert proc.poll() is None, log.read_text()
        if "listening on" not in log.read_text():
            return False
        try:
            return gw.get("/healthz")[0] == 200
        except OSError:
            return False

    wait_until(up, timeout=30)
    return gw


@dataclass
class Deployment:
    server: EmbeddedRedis
    settings: Settings
    passwords: dict[str, str]
    gateway: Gateway
    token_a: str  # prefix team-a/, no host
    token_host: str  # prefix team-a/laptop-42/, host laptop-42
    token_b: str  # prefix team-b/

    def root(self) -> redis.Redis:
        return redis.Redis(port=self.server.port, username=ROOT_USER, password=ROOT_PASSWORD, socket_timeout=10)

    def creds(self, role: str) -> dict[str, str]:
        return {"GOOSE_INGEST_REDIS_USERNAME": user_name(role, self.settings.namespace),
                "GOOSE_INGEST_REDIS_PASSWORD": self.passwords[role]}

    def raw(self) -> list[tuple[bytes, dict[bytes, bytes]]]:
        r = self.root()
        return [e for s in self.settings.layout.raw_streams() for e in r.xrange(s)]

    def raw_count(self) -> int:
        r = self.root()
        return sum(r.xlen(s) for s in self.settings.layout.raw_streams())


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gateway")
    acl_path = tmp / "users.acl"
    acl_path.write_text(BOOTSTRAP_ACL)
    server = start_redis(dir=str(tmp / "redis"), extra_args=["--aclfile", str(acl_path)])
    settings = Settings(redis_url=server.url, namespace=f"gw{uuid4().hex[:6]}", shards=2,
                        spool_dir=str(tmp / "spool"), host_label="test-host")
    passwords = {role: f"pw-{role}-{uuid4().hex[:8]}" for role in ROLE_NAMES}
    acl_path.write_text(render(settings.layout, passwords) + f"user {ROOT_USER} on >{ROOT_PASSWORD} ~* &* +@all\n")
    with redis.Redis(port=server.port, socket_timeout=10) as c:
        c.execute_command("ACL", "LOAD")
    admin = redis.Redis(port=server.port, username=user_name("admin", settings.namespace),
                        password=passwords["admin"], socket_timeout=10)
    token_a, _ = tokens.create(admin, settings.layout, "team-a/", {})
    token_host, _ = tokens.create(admin, settings.layout, "team-a/laptop-42/", {"host": "laptop-42"})
    token_b, _ = tokens.create(admin, settings.layout, "team-b/", {})
    gw = None
    try:
        creds = {"GOOSE_INGEST_REDIS_USERNAME": user_name("gateway", settings.namespace),
                 "GOOSE_INGEST_REDIS_PASSWORD": passwords["gateway"]}
        # the byte rate well above the default (4 MiB/s per token): the bombs of one test must not leave
        # token_a in debt for the next ones (the limits have tests of their own)
        gw = start_gateway(settings, tmp / "gateway.log", GOOSE_INGEST_GATEWAY_TOKEN_CACHE_S="0.5",
                           GOOSE_INGEST_GATEWAY_RATE_BYTES_PER_S=str(256 << 20), **creds)
        yield Deployment(server, settings, passwords, gw, token_a, token_host, token_b)
    finally:
        if gw is not None:
            stop(gw.proc)
        server.close()


def ndjson(entries: list[dict]) -> bytes:
    return b"".join(orjson.dumps(e) + b"\n" for e in entries)


def fixture_entries(run: str, path: Path = FIXTURE) -> list[dict]:
    lines = path.read_text("utf-8").splitlines()
    out: list[dict] = [{"run": run, "seq": i, "ts": 1_790_000_000_000 + i, "kind": "line", "stream": "stdout",
                        "line": line} for i, line in enumerate(lines)]
    out.append({"run": run, "seq": len(lines), "ts": 1_790_000_000_000 + len(lines), "kind": "eof", "exit": 0})
    return out


# --- the pure parts ---------------------------------------------------------------------------------
def test_body_functions_are_total_and_bounded():
    bomb = zlib.compress(b"\0" * (64 << 20), 9)
    with pytest.raises(BodyError) as exc:
        decompress(gzip.compress(b"\0" * (8 << 20)), "gzip", 1 << 20)
    assert exc.value.status == 413
    with pytest.raises(BodyError) as exc:
        decompress(bomb, "deflate", 1 << 20)
    assert exc.value.status == 413
    for bad, enc in ((b"not gzip", "gzip"), (b"not zstd", "zstd"), (gzip.compress(b"[1]")[:-6], "gzip")):
        with pytest.raises(BodyError) as exc:
            decompress(bad, enc, 1 << 20)
        assert exc.value.status == 400
    with pytest.raises(BodyError) as exc:
        decompress(b"x", "br", 1 << 20)
    assert exc.value.status == 415
    for body in (b"[" * 100_000, b'{"run": ', b"[1, 2", b'{"a": 1}\n{', b"\xff\xfe"):
        with pytest.raises(BodyError) as exc:
            parse(body)
        assert exc.value.status == 400
    assert decompress(gzip.compress(b"[1,") + gzip.compress(b"2]"), "gzip", 100) == b"[1,2]"  # members
    # members and frames: linear (an offset, no copy of the rest each), counted and bounded (413 beyond)
    import zstandard

    from services.gateway.body import MAX_ENTRIES, MAX_PARTS

    for one, enc in ((gzip.compress(b"a\n"), "gzip"), (zstandard.ZstdCompressor().compress(b"a\n"), "zstd")):
        assert decompress(one * MAX_PARTS, enc, 1 << 20) == b"a\n" * MAX_PARTS
        with pytest.raises(BodyError) as exc:
            decompress(one * 200_000, enc, 1 << 20)
        assert exc.value.status == 413 and f"more than {MAX_PARTS}" in exc.value.reason
        with pytest.raises(BodyError) as exc:
            decompress(one * 3 + one[:-2], enc, 1 << 20)
        assert exc.value.status == 400  # the last member or frame is cut short
    big = gzip.compress(os.urandom(200_000))  # a member longer than one decode step
    assert len(decompress(big + big, "gzip", 1 << 20)) == 400_000
    # entries: counted before anything is parsed (a 2-byte `{}` is a 64-byte dict)
    assert len(parse(b"{}\n" * MAX_ENTRIES)) == MAX_ENTRIES
    for body in (b"{}\n" * (MAX_ENTRIES + 1), b"{}\n" * MAX_ENTRIES + b"{}", b"[" + b"{}," * (1 << 20) + b"{}]"):
        with pytest.raises(BodyError) as exc:
            parse(body)
        assert exc.value.status == 413
    assert len(parse(b"[" + b",".join([b'{"line":"' + b"," * 200 + b'"}'] * 100) + b"]")) == 100  # commas in strings
    # a long line that is no flat object is refused as an entry without being parsed (5.6 M lists otherwise);
    # brackets, braces, quotes and backslashes inside strings are no reason
    nested = b'{"run":"team-a/r","seq":0,"a":[' + b"[]," * 100_000 + b'[]]}'
    many_fields = b"{" + b",".join(b'"k%d":"v"' % i for i in range(100)) + b"}"
    got = parse(nested + b"\n" + many_fields + b"\n")
    for bad in got:
        refused = check_entry(bad, "team-a/", {}, 1 << 20)
        assert isinstance(refused, Refused) and refused.reason == "invalid-entry", refused
    tricky = {"run": "team-a/r", "seq": 1, "line": '{"a":[1,{"b":"\\"}],"c":"\\\\"} [x] {y} \\ "' * 50}
    raw = orjson.dumps(tricky)
    assert len(raw) > 256 and parse(raw + b"\n") == [tricky]
    assert isinstance(check_entry(parse(raw)[0], "team-a/", {}, 1 << 20), Accepted)
    assert parse(b'"a string"') == ["a string"]  # valid NDJSON: that entry is refused, not the request
    assert parse(b"") == [] and parse(b'\n{"a":1}\n\n{"b":2}\n') == [{"a": 1}, {"b": 2}]
    ok = check_entry({"run": "team-a/r", "seq": 3, "ts": "2026-01-01T00:00:00Z", "line": "x", "host": "mine",
                      "_src": "file:/home/me/x"}, "team-a/", {"host": "laptop-42"}, 1 << 20)
    assert ok.fields == {b"run": b"team-a/r", b"seq": b"3", b"ts": b"1767225600000", b"line": b"x",  # type: ignore[union-attr]
                         b"host": b"laptop-42"}
    refusals = {
        "abandon": {"run": "team-a/r", "seq": 0, "kind": "abandon", "through": 3},
        "no object": [1, 2],
        "bad b64": {"run": "team-a/r", "seq": 0, "line_b64": "%%"},
        "float": {"run": "team-a/r", "seq": 0.5, "line": "x"},
        "nested": {"run": "team-a/r", "seq": 0, "line": {"a": 1}},
        "other prefix": {"run": "team-b/r", "seq": 0, "line": "x"},
        "parent elsewhere": {"run": "team-a/r", "seq": 0, "line": "x", "parent": "team-b/p"},
        "oversize by another field": {"run": "team-a/r", "seq": 0, "line": "x", "note": "n" * 2048},
        "oversize elsewhere": {"run": "team-b/r", "seq": 0, "line": "x" * 2048},
    }
    for name, obj in refusals.items():
        assert not hasattr(check_entry(obj, "team-a/", {}, 1024), "fields"), name
    # oversize by its line: kept cut (contract fields only), still over the limit so the workers dead-letter it
    cut = check_entry({"run": "team-a/r", "seq": 0, "line": "x" * 2048, "note": "n"}, "team-a/", {"host": "h"}, 1024)
    assert cut.cut == 11 + 4 + 2052 + 5 + 5  # type: ignore[union-attr]  # run seq line note host, names and values
    assert cut.fields == {b"run": b"team-a/r", b"seq": b"0", b"line": b"x" * 1024, b"host": b"h"}  # type: ignore[union-attr]


def test_group_commit_fails_only_the_request_whose_command_failed_and_all_on_a_lost_connection(tmp_path):
    """services/gateway/writer.py on a real redis-server: requests queued while a pipeline is in flight
    go out together; an error reply fails its own request only; a WAIT short of replicas fails the
    group; a broker that went away fails every request (the gateway's 503), and the writer recovers."""
    import asyncio

    from redis import asyncio as aioredis

    from services.gateway.writer import GroupWriter, WriteFailed
    from services.tap.resp import command, xadd

    server = start_redis(dir=str(tmp_path / "redis"))
    sync = redis.Redis(port=server.port)
    sync.set("not-a-stream", "x")

    def writer(wait: int = 0) -> GroupWriter:
        pool = aioredis.ConnectionPool.from_url(server.url, socket_timeout=5)
        return GroupWriter(pool.make_connection, connections=1, wait_replicas=wait, wait_timeout_ms=50,
                           on_error=lambda exc: f"failed: {type(exc).__name__}")

    ok = [xadd(b"s", [(b"run", b"r"), (b"seq", b"%d" % i)]) for i in range(3)]

    async def scenario() -> None:
        w = writer()
        await w.write(ok[:1])  # the connection is made
        slow = asyncio.ensure_future(w.write([command(b"BLPOP", b"nothing", b"0.3")]))  # in flight for 0.3 s
        await asyncio.sleep(0.1)
        outcomes = await asyncio.gather(
            w.write(ok[1:2]), w.write([xadd(b"not-a-stream", [(b"a", b"b")])]), w.write(ok[2:]),
            return_exceptions=True)
        await slow
        assert outcomes[0] is None and outcomes[2] is None
        assert isinstance(outcomes[1], WriteFailed) and "ResponseError" in str(outcomes[1])
        assert w.groups == 3  # the first write, the slow one, then the three queued meanwhile as one
        assert sync.xlen(b"s") == 3
        with pytest.raises(WriteFailed, match="0 of 1 replicas"):
            await writer(wait=1).write(ok[:1])  # stored, but not known to be replicated: 503, resent
        server.close()
        outcomes = await asyncio.gather(w.write(ok[:1]), w.write(ok[1:2]), return_exceptions=True)
        assert all(isinstance(o, WriteFailed) and "ConnectionError" in str(o) for o in outcomes), outcomes
        restarted.append(start_redis(port=server.port, dir=str(tmp_path / "redis2")))
        await w.write(ok[:1])  # the same writer reconnects
        assert redis.Redis(port=server.port).xlen(b"s") == 1

    restarted: list[EmbeddedRedis] = []
    try:
        asyncio.run(scenario())
    finally:
        server.close()
        for r in restarted:
            r.close()


def test_rate_limiter_admits_before_the_work_and_charges_what_was_sent_then_decoded():
    now = [0.0]
    limiter = RateLimiter(100, 10_000, clock=lambda: now[0])
    assert limiter.admit("t") == 0
    limiter.charge("t", 0, 300)  # the compressed body, charged before it is decoded
    limiter.charge("t", 50, 30_000)  # what it decoded to: into debt
    assert limiter.admit("t") == pytest.approx(2.03, abs=0.01)  # the next request waits, unread
    assert limiter.admit("other") == 0  # another token is not charged
    now[0] = 2.1
    assert limiter.admit("t") == 0


def test_rate_limiter_refuses_over_the_rate_and_says_when_to_retry():
    now = [0.0]
    rl = RateLimiter(100, 1000, clock=lambda: now[0])
    assert rl.take("t", 150, 10) == 0  # a batch above one second's allowance passes once (debt)...
    wait = rl.take("t", 1, 1)
    assert 0.4 < wait <= 0.5  # ...then the token waits until the debt is paid
    assert rl.take("other", 1, 1) == 0  # per token
    now[0] += 0.6
    assert rl.take("t", 1, 1) == 0
    assert RateLimiter(0, 0).take("t", 10**9, 10**12) == 0  # 0: no limit


# --- a plain HTTP client, a real worker ----------------------------------------------------------------
def test_a_plain_http_post_is_stored_and_processed_by_a_worker(deployment, tmp_path):
    d = deployment
    run = f"team-a/laptop-42/{uuid4().hex[:8]}"
    entries = fixture_entries(run)
    for e in entries:
        e["host"] = "not-what-the-token-says"
    half = len(entries) // 2
    status, reply, _ = d.gateway.post(ndjson(entries[:half]), d.token_host)
    assert status == 200, reply
    assert reply["stored"] == half and reply["refused"] == 0 and all(r["stored"] for r in reply["results"])
    # the second half as a gzip'ed JSON array, sent twice (a retried batch): the workers drop the copies
    body = gzip.compress(orjson.dumps(entries[half:]))
    for _ in range(2):
        status, reply, _ = d.gateway.post(body, d.token_host, {"Content-Type": "application/json",
                                                               "Content-Encoding": "gzip"})
        assert status == 200 and reply["stored"] == len(entries) - half, reply
    stored = [f for _, f in d.raw() if f[b"run"] == run.encode()]
    assert {f[b"host"] for f in stored} == {b"laptop-42"}  # the token's host, not the body's
    worker = start_worker(d.settings, tmp_path / "worker.log", **d.creds("worker"))
    try:
        def ended() -> bool:
            r = d.root()
            return any(f[b"runId"] == run.encode() and f[b"state"] == b"ended"
                       for s in d.settings.layout.runs_partitions() for _, f in r.xrange(s))

        wait_until(ended, timeout=60)
    finally:
        stop(worker)
    r = d.root()
    events = [orjson.loads(f[b"data"]) for s in d.settings.layout.events_partitions() for _, f in r.xrange(s)]
    got = [e for e in events if e["runId"] == run]
    assert got == _expected(d, run) and got


def _expected(d: Deployment, run: str) -> list[dict]:
    admin = d.settings.model_copy(update={"redis_url": f"redis://{user_name('admin', d.settings.namespace)}:"
                                                        f"{d.passwords['admin']}@127.0.0.1:{d.server.port}/0"})
    return expected_events(admin, run)


# --- authentication and namespaces ------------------------------------------------------------------
def secret_of(token: str) -> str:
    """The secret part of `gik_<hex id>_<secret>`, whole: the secret is URL-safe base64, which has
    underscores of its own (a split at the last one left a tail of a letter or two, found in any log)."""
    secret = token.split("_", 2)[2]
    assert len(secret) >= 43, token
    return secret


def test_missing_wrong_and_revoked_tokens_get_401_and_write_nothing(deployment):
    d = deployment
    body = ndjson([{"run": "team-a/x/1", "seq": 0, "line": "hello"}])
    before = d.raw_count()
    fake = "gik_0123456789ab_" + "A" * 43
    for token in (None, "", "nonsense", fake, d.token_a[:-1] + ("B" if d.token_a[-1] != "B" else "C")):
        status, reply, headers = d.gateway.post(body, token)
        assert status == 401 and "www-authenticate" in headers, (token, reply)
    admin = redis.Redis(port=d.server.port, username=user_name("admin", d.settings.namespace),
                        password=d.passwords["admin"], socket_timeout=10)
    doomed, rec = tokens.create(admin, d.settings.layout, "team-a/", {})
    assert d.gateway.post(body, doomed)[0] == 200
    assert tokens.revoke(admin, d.settings.layout, rec.id)
    time.sleep(0.7)  # the replica's cache TTL in this test (GATEWAY_TOKEN_CACHE_S=0.5)
    status, reply, _ = d.gateway.post(body, doomed)
    assert status == 401, reply
    assert d.raw_count() == before + 1
    # no token, not even a part of one, in the gateway's log or metrics
    _, metrics = d.gateway.get("/metrics")
    for token in (d.token_a, doomed, fake):
        secret = secret_of(token)
        assert secret not in d.gateway.log.read_text() and secret not in metrics


def test_another_prefix_or_another_hosts_run_is_refused_403_and_nothing_is_written(deployment):
    d = deployment
    before = d.raw_count()
    victim = "team-a/laptop-7/victim-run"
    attacks = [
        # a token of team-b writing into team-a, one good entry beside it: the whole request is refused
        (d.token_b, [{"run": "team-b/ok/1", "seq": 0, "line": "fine"}, {"run": "team-a/x/1", "seq": 0, "line": "injected"}]),
        # the review's probe: laptop-42's token ends another host's run with exit 1, injects a message
        (d.token_host, [{"run": victim, "seq": 5, "kind": "eof", "exit": 1}]),
        (d.token_host, [{"run": victim, "seq": 4, "line": '{"type":"message","message":{"role":"assistant"}}'}]),
        # ... or names it as a parent
        (d.token_host, [{"run": "team-a/laptop-42/r", "seq": 0, "line": "x", "parent": victim}]),
    ]
    for token, entries in attacks:
        status, reply, _ = d.gateway.post(ndjson(entries), token)
        assert status == 403, reply
        assert "outside the token's prefix" in reply["reason"]
    assert d.raw_count() == before


def test_the_reviews_stream_attacks_are_impossible_through_the_gateway(deployment):
    """MAXLEN 0, an explicit maximal id, an id in 2286: a caller controls field names and values only,
    and the gateway writes `XADD <shard> * run ... <fields>`: what looks like an option is a field."""
    d = deployment
    run = "team-a/attacker/1"
    status, reply, _ = d.gateway.post(ndjson([{"run": run, "seq": i, "line": f"l{i}"} for i in range(3)]), d.token_a)
    assert status == 200
    stream = d.settings.layout.raw_stream(d.settings.layout.shard_of(run))
    before = d.root().xlen(stream)
    hostile = [
        {"run": run, "seq": 3, "line": "x", "MAXLEN": "0"},
        {"run": run, "seq": 4, "line": "x", "id": "18446744073709551615-18446744073709551615"},
        {"run": run, "seq": 5, "line": "x", "*": "9999999999999-0", "MINID": "9999999999999"},
        {"run": run, "seq": 6, "kind": "abandon", "through": 6, "missing": "[]"},  # a worker-only control entry
    ]
    status, reply, _ = d.gateway.post(ndjson(hostile), d.token_a)
    assert status == 200
    assert [r["stored"] for r in reply["results"]] == [True, True, True, False]
    assert reply["results"][3]["reason"] == "invalid-entry"
    r = d.root()
    assert r.xlen(stream) == before + 3  # nothing trimmed
    last_ms = int(r.xinfo_stream(stream)["last-generated-id"].split(b"-")[0])
    assert abs(last_ms - time.time() * 1000) < 60_000  # ids are the server's clock, not the caller's
    assert d.gateway.post(ndjson([{"run": run, "seq": 7, "line": "after"}]), d.token_a)[0] == 200  # the shard still takes XADD *


def test_the_gateway_user_may_only_append_to_raw_streams_and_read_tokens(deployment):
    d = deployment
    gw = redis.Redis(port=d.server.port, username=user_name("gateway", d.settings.namespace),
                     password=d.passwords["gateway"], socket_timeout=10)
    raw = d.settings.layout.raw_stream(0)
    assert gw.xadd(raw, {"probe": "1"})
    refused = [
        lambda: gw.xadd(d.settings.layout.control_stream(0), {"kind": "abandon"}),
        lambda: gw.xtrim(raw, maxlen=0),
        lambda: gw.xrange(raw),
        lambda: gw.hgetall(d.settings.layout.run_state("team-a/r")),
        lambda: gw.hset(d.settings.layout.gateway_token("0123456789ab"), "prefix", "/"),
        lambda: gw.delete(raw),
        lambda: gw.xadd(d.settings.layout.events_partition(0), {"x": "1"}),
    ]
    for attempt in refused:
        with pytest.raises(redis.exceptions.NoPermissionError):
            attempt()
    d.root().xtrim(raw, minid="99999999999999")  # the probe out again (the worker would dead-letter it)


# --- hostile bodies --------------------------------------------------------------------------------------
def _raw_post(url: str, headers: dict[str, str], chunks, timeout: float = 30) -> tuple[int, float]:
    """POST with http.client, sending chunks until the server answers or closes: (status, seconds)."""
    host, port = url.removeprefix("http://").split(":")
    started = time.monotonic()
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    conn.putrequest("POST", "/v1/raw")
    for k, v in headers.items():
        conn.putheader(k, v)
    conn.endheaders()
    sock = conn.sock
    try:
        for chunk in chunks:
            if select.select([sock], [], [], 0)[0]:  # an answer (or a close) before the whole body
                break
            sock.sendall(chunk)
    except (BrokenPipeError, ConnectionResetError):
        pass
    resp = conn.getresponse()
    resp.read()
    conn.close()
    return resp.status, time.monotonic() - started


def test_huge_bodies_and_compression_bombs_get_413_quickly_with_bounded_memory(deployment):
    d = deployment
    auth = {"Authorization": f"Bearer {d.token_a}"}
    before = d.raw_count()
    mib = b"x" * (1 << 20)
    # 100 MB announced: refused on the header, before reading
    status, took = _raw_post(d.gateway.url, {**auth, "Content-Length": str(100 << 20)}, (mib for _ in range(100)))
    assert status == 413 and took < 10
    # 100 MB chunked (no length): refused once the limit is passed, not after reading it all
    status, took = _raw_post(d.gateway.url, {**auth, "Transfer-Encoding": "chunked"},
                             (b"%x\r\n%b\r\n" % (len(mib), mib) for _ in range(100)))
    assert status == 413 and took < 20
    hwm_before = d.gateway.rss_hwm_kib()
    # a gzip bomb: 1 MiB on the wire, 256 MiB inflated; a zstd one: 8 KiB for 256 MiB; a gzip of 64
    # members of 16 MiB each
    c = zlib.compressobj(1, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = b"\0" * (16 << 20)
    bomb = b"".join(c.compress(zeros) for _ in range(16)) + c.flush()
    member = gzip.compress(zeros, 1)
    import zstandard

    zbomb = zstandard.ZstdCompressor(level=3).compressobj()
    zbody = b"".join(zbomb.compress(zeros) for _ in range(16)) + zbomb.flush()
    for body, enc in ((bomb, "gzip"), (zbody, "zstd"), (member * 64, "gzip")):
        started = time.monotonic()
        status, reply, _ = d.gateway.post(body, d.token_a, {"Content-Encoding": enc})
        assert status == 413 and "decompressed" in reply["reason"], reply
        assert time.monotonic() - started < 10
    # inflating stopped at the limit (16 MiB by default): the process did not grow by the bomb's size
    assert d.gateway.rss_hwm_kib() - hwm_before < 100 * 1024
    assert d.raw_count() == before


def test_malformed_and_deep_json_get_400_with_the_reason(deployment):
    d = deployment
    before = d.raw_count()
    for body, ctype in ((b"[" * 200_000, "application/json"), (b'[{"run": "team-a/x", ', "application/json"),
                        (b'{"run": "team-a/x", "seq": 0, "line": "a"}\n{oops}\n', "application/x-ndjson"),
                        (b"\xff\xfe", "application/json")):
        status, reply, _ = d.gateway.post(body, d.token_a, {"Content-Type": ctype})
        assert status == 400 and reply["reason"], reply
    status, reply, _ = d.gateway.post(b"[]", d.token_a, {"Content-Encoding": "br"})
    assert status == 415
    assert d.raw_count() == before
    assert d.gateway.proc.poll() is None  # still serving


def test_an_endless_request_head_gets_431_and_costs_bounded_memory(deployment):
    """httptools (the gateway's parser when installed) has no bound of its own on a head: a URL or header
    that never ends is cut at 64 KiB (services/gateway/http.py); a large body is not mistaken for one."""
    d = deployment
    host, port = d.gateway.url.removeprefix("http://").split(":")
    rss_before = d.gateway.rss_hwm_kib()
    for start in (b"POST /v1/raw HTTP/1.1\r\nHost: x\r\nX-Pad: ", b"GET /healthz?" ):
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(start)
            answer = b""
            try:
                for _ in range(64 * 1024):  # up to 64 MiB, 1 KiB a send, until the gateway answers or closes
                    if select.select([sock], [], [], 0)[0]:
                        break
                    sock.sendall(b"a" * 1024)
            except (BrokenPipeError, ConnectionResetError):
                pass
            try:
                answer = sock.recv(4096)
            except ConnectionResetError:
                pass
        assert answer.startswith((b"HTTP/1.1 431", b"HTTP/1.1 400")), answer[:100]
    assert d.gateway.rss_hwm_kib() - rss_before < 20 * 1024
    # a body far larger than the head bound, in the same reads as its head, is a normal request
    run = f"team-a/big/{uuid4().hex[:8]}"
    big = ndjson([{"run": run, "seq": i, "line": "y" * 1000} for i in range(200)])
    status, reply, _ = d.gateway.post(big, d.token_a)
    assert status == 200 and reply["stored"] == 200, reply
    assert d.gateway.get("/healthz")[0] == 200


def test_metrics_health_readiness_and_the_openapi_reply_model(deployment):
    d = deployment
    status, reply, _ = d.gateway.post(ndjson([{"run": "team-a/m/1", "seq": 0, "line": "x"}, {"run": "team-a/m/1"}]),
                                      d.token_a)
    assert status == 200
    assert IngestReply.model_validate(reply).results[1].reason == "invalid-entry"
    status, reply, _ = d.gateway.post(ndjson([{"run": "team-b/m/1", "seq": 0, "line": "x"}]), d.token_a)
    assert status == 403 and ErrorReply.model_validate(reply).entries == [0]
    assert d.gateway.get("/healthz")[0] == 200
    assert d.gateway.get("/readyz") == (200, "ready\n")
    status, text = d.gateway.get("/metrics")
    assert status == 200
    assert 'goose_ingest_gateway_requests_total{status="200"}' in text
    assert 'goose_ingest_gateway_entries_total{reason="outside-prefix",result="refused"}' in text
    assert "team-a" not in text  # no run key, no prefix in any label


# --- Redis down, rate limits: a gateway of its own on a redis-server it can stop ----------------------
def test_redis_down_gives_503_with_retry_after_and_a_token_over_its_rate_gets_429(tmp_path):
    server = start_redis(dir=str(tmp_path / "redis"))
    settings = Settings(redis_url=server.url, namespace=f"gw{uuid4().hex[:6]}", shards=2,
                        spool_dir=str(tmp_path / "spool"))
    token, _ = tokens.create(redis.Redis(port=server.port), settings.layout, "team-a/", {})
    gw = start_gateway(settings, tmp_path / "gw.log", GOOSE_INGEST_GATEWAY_TOKEN_CACHE_S="60",
                       GOOSE_INGEST_GATEWAY_RATE_LINES_PER_S="100", GOOSE_INGEST_GATEWAY_BODY_TIMEOUT_S="1")
    try:
        # a slow-loris body: 10 of 100 announced bytes, then nothing -> 408 after the body timeout
        host, port = gw.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(b"POST /v1/raw HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + token.encode()
                         + b"\r\nContent-Length: 100\r\n\r\n0123456789")
            started = time.monotonic()
            answer = sock.recv(4096)
        assert answer.startswith(b"HTTP/1.1 408"), answer[:100]
        assert time.monotonic() - started < 5
        # ... and a head that never completes, or never starts: 408 and closed after the same timeout
        # (else each would hold a slot of GATEWAY_MAX_CONNECTIONS for ever)
        for opening in (b"POST /v1/raw HTTP/1.1\r\nHost: x\r\nAuthor", b""):
            with socket.create_connection((host, int(port)), timeout=10) as sock:
                sock.sendall(opening)
                started = time.monotonic()
                answer = sock.recv(4096)
                assert sock.recv(4096) == b""  # closed
            assert answer.startswith(b"HTTP/1.1 408"), (opening, answer[:100])
            assert 0.5 < time.monotonic() - started < 5
        batch = ndjson([{"run": "team-a/r", "seq": i, "line": "x"} for i in range(150)])
        assert gw.post(batch, token)[0] == 200
        status, reply, headers = gw.post(batch, token)
        assert status == 429 and int(headers["retry-after"]) >= 1, reply
        assert gw.post(batch, token)[0] == 429
        # held at its rate: counted (no token label) and said once in the log, by id
        assert "goose_ingest_gateway_tokens_at_limit 1.0" in gw.get("/metrics")[1]
        token_id = token.split("_")[1]
        said = [line for line in gw.log.read_text().splitlines() if "is held at its rate" in line]
        assert len(said) == 1 and f"token {token_id} " in said[0] and token not in gw.log.read_text()
        time.sleep(0.6)
        server.close()
        status, reply, headers = gw.post(ndjson([{"run": "team-a/r", "seq": 200, "line": "x"}]), token)
        assert status == 503 and headers["retry-after"] == "1", reply
        assert gw.get("/readyz")[0] == 503
        assert gw.proc.poll() is None
    finally:
        stop(gw.proc)
        server.close()


# --- the tap through the gateway ----------------------------------------------------------------------------
def _tap_env(d: Deployment, endpoint: str, token_file: Path, **extra: str) -> dict[str, str]:
    env = cli_env(d.settings, GOOSE_INGEST_ENDPOINT=endpoint,
                  GOOSE_INGEST_TOKEN_FILE=str(token_file), **extra)
    env["GOOSE_INGEST_REDIS_URL"] = ""  # an agent host without any broker credential
    return env


def test_publish_through_the_gateway_spools_while_it_is_down_then_delivers_in_order(deployment, tmp_path):
    d = deployment
    token_file = tmp_path / "token"
    token_file.write_text(d.token_host + "\n")
    os.chmod(token_file, 0o600)
    # a second gateway on a port where nothing listens yet: the tap spools
    port = free_port()
    run = f"team-a/laptop-42/{uuid4().hex[:8]}"
    lines = [f"line {i}" for i in range(500)]
    src = tmp_path / "in.txt"
    src.write_text("\n".join(lines) + "\n")
    env = _tap_env(d, f"http://127.0.0.1:{port}", token_file, GOOSE_INGEST_PUBLISH_BATCH="64")
    pub = subprocess.Popen([sys.executable, "-m", "services.cli", "publish", "--run", run, str(src)], cwd=REPO, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    gw2 = None
    try:
        time.sleep(2.0)
        assert pub.poll() is None  # still waiting to deliver
        assert not [f for _, f in d.raw() if f[b"run"] == run.encode()]
        gw2 = start_gateway(d.settings, tmp_path / "gw2.log", port=port,
                            **{"GOOSE_INGEST_REDIS_USERNAME": user_name("gateway", d.settings.namespace),
                               "GOOSE_INGEST_REDIS_PASSWORD": d.passwords["gateway"]})
        out, _ = pub.communicate(timeout=60)
        assert pub.returncode == 0, out.decode()
    finally:
        if pub.poll() is None:
            pub.kill()
        if gw2 is not None:
            stop(gw2.proc)
    stored = [f for _, f in d.raw() if f[b"run"] == run.encode()]
    assert [int(f[b"seq"]) for f in stored] == list(range(501))  # 0 lost, 0 doubled, in order
    assert [f[b"line"].decode() for f in stored[:-1]] == lines and stored[-1][b"kind"] == b"eof"
    assert {f[b"host"] for f in stored} == {b"laptop-42"}
    assert b"gik_" not in out and d.token_host.encode() not in out


def test_tap_through_the_gateway_delivers_a_fixture_end_to_end(deployment, tmp_path):
    d = deployment
    token_file = tmp_path / "token"
    token_file.write_text(d.token_a)
    run = f"team-a/ci/{uuid4().hex[:8]}"
    env = _tap_env(d, d.gateway.url, token_file)
    out = subprocess.run([sys.executable, "-m", "services.cli", "tap", "--quiet", "--run", run, "--",
                          "cat", str(FIXTURE)], cwd=REPO, env=env, capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr.decode()
    stored = [f for _, f in d.raw() if f[b"run"] == run.encode()]
    want = FIXTURE.read_bytes().splitlines()
    assert [f[b"line"] for f in stored if f[b"kind"] == b"line"] == want
    assert [int(f[b"seq"]) for f in stored] == list(range(len(want) + 1))
    # a wrong token: one line and exit 2 at start, naming the cause, as a wrong Redis password is
    token_file.write_text("gik_0123456789ab_" + "A" * 43)
    run2 = f"team-a/ci/{uuid4().hex[:8]}"
    out = subprocess.run([sys.executable, "-m", "services.cli", "tap", "--quiet", "--drain-timeout", "1", "--run", run2,
                          "--", "cat", str(FIXTURE)], cwd=REPO, env=env, capture_output=True, timeout=60)
    assert out.returncode == 2 and len(out.stderr.splitlines()) == 1, out.stderr.decode()
    assert b"the gateway refused the token (401" in out.stderr and b"TOKEN_FILE" in out.stderr
    assert b"AAAA" not in out.stderr and b"unreachable" not in out.stderr
    assert not [f for _, f in d.raw() if f[b"run"] == run2.encode()]
    # a run key outside the token's prefix: the same, before anything is spooled
    token_file.write_text(d.token_a)
    out = subprocess.run([sys.executable, "-m", "services.cli", "tap", "--quiet", "--run", f"team-b/{uuid4().hex[:8]}",
                          "--", "cat", str(FIXTURE)], cwd=REPO, env=env, capture_output=True, timeout=60)
    assert out.returncode == 2 and len(out.stderr.splitlines()) == 1, out.stderr.decode()
    assert b"outside the token's prefix 'team-a/'" in out.stderr and b"--run team-a/" in out.stderr


def test_entries_refused_one_by_one_in_a_200_are_kept_beside_the_spool_with_their_reason(tmp_path):
    """The other way an entry is refused for good (in a 200: invalid-entry): kept, with the gateway's reason."""
    from services.tap.http_transport import HttpTransport
    from services.tap.spool import refused_runs

    settings = Settings(endpoint="http://127.0.0.1:1", token="gik_0123456789ab_" + "C" * 43, namespace="kept",
                        spool_dir=str(tmp_path / "spool"))
    recs = [orjson.dumps({"run": "team-a/k", "seq": str(i), "kind": "line", "line": f"l{i}"}) + b"\n" for i in range(3)]
    reply = orjson.dumps({"stored": 2, "refused": 1, "results": [
        {"stored": True}, {"stored": False, "reason": "invalid-entry", "detail": "'ts' is not a time"}, {"stored": True}]})
    HttpTransport(settings)._report(reply, recs)
    [(run, n, path)] = refused_runs(settings)
    assert (run, n) == ("team-a/k", 1)
    kept = orjson.loads(path.read_bytes())
    assert kept == {"reason": "invalid-entry: 'ts' is not a time", "entry": orjson.loads(recs[1])}


def test_a_refusal_mid_run_is_logged_as_the_gateways_refusal_never_as_an_unreachable_broker(deployment, tmp_path,
                                                                                             caplog):
    """A token revoked (401) or a run key outside the prefix (403) after the start: the publisher says
    which, keeps the entries spooled, and asks again only rarely (no outage backoff)."""
    from services.tap.publisher import Publisher

    d = deployment
    cases = [("gik_0123456789ab_" + "B" * 43, "team-a/x/" + uuid4().hex[:6], "the gateway refused the token (401"),
             (d.token_a, "team-b/" + uuid4().hex[:6], "the gateway refused the run key (403")]
    for token, run, says in cases:
        caplog.clear()
        settings = Settings(endpoint=d.gateway.url, token=token, namespace=d.settings.namespace, shards=2,
                            spool_dir=str(tmp_path / "spool"))
        with caplog.at_level(logging.WARNING, logger="goose_ingest.tap"):
            pub = Publisher(settings, run)
            pub.add_line(b"a line")
            assert not pub.flush(3.0)
            assert pub.refusal is not None and says in pub.refusal
            pub.close(timeout=0)
        text = caplog.text
        assert says in text and "unreachable" not in text and "AAAA" not in text, text
        assert text.count(says) == 1  # said once, not once per retry
        assert not [f for _, f in d.raw() if f[b"run"] == run.encode()]


def test_a_refusal_ends_the_drain_at_once_with_the_entries_kept_and_spool_drain_goes_on(deployment, tmp_path):
    """A refusal is no outage at the end either: a non-interactive publish (no drain timeout: it would wait
    for an outage for ever) whose token the gateway refuses once it is back says so and stops at once, its
    entries spooled, its last line naming the 401 and `spool --discard`; `spool --drain` delivers the run it can and stops
    on the one outside the token's prefix (403) instead of retrying it for ever."""
    from services.tap.outcome import UNDELIVERED_EXIT

    d = deployment
    token_file = tmp_path / "token"
    token_file.write_text("gik_0123456789ab_" + "D" * 43 + "\n")  # well-formed, unknown; no prefix line
    port = free_port()
    run = f"team-a/laptop-42/{uuid4().hex[:8]}"
    src = tmp_path / "in.txt"
    src.write_text("one\ntwo\n")
    pub = _publish_through(d, f"http://127.0.0.1:{port}", token_file, run, src)
    gw2 = None
    try:
        time.sleep(2.0)
        assert pub.poll() is None  # the gateway is down: spooled, waiting for it
        gw2 = start_gateway(d.settings, tmp_path / "gw2.log", port=port, **d.creds("gateway"))
        out, _ = pub.communicate(timeout=60)  # before: retried every 30 s until killed
    finally:
        if pub.poll() is None:
            pub.kill()
        if gw2 is not None:
            stop(gw2.proc)
    said = out.decode().strip().splitlines()
    assert pub.returncode == 1, out.decode()[-2000:]  # publish's exit when entries stay spooled
    # while the gateway was down: an outage, rightly, of the gateway (an agent host has no broker to name)
    assert said[0].startswith("goose-ingest: gateway out of service at ") and "broker" not in said[0], said[0]
    # once it answers, the refusal is said as such (once), and the last line names it and `spool --discard`
    assert sum("the gateway refused the token (401" in x and "retrying every 30 s" in x for x in said) == 1, said
    assert "the gateway refused the token (401" in said[-1] and f"spool --discard {run}" in said[-1], said[-1]
    assert "unreachable" not in said[-1] and "broker" not in out.decode() and "D" * 43 not in out.decode()
    # a second run outside the token's prefix, spooled while no gateway answered (its prefix unknown then)
    outside = f"team-b/{uuid4().hex[:8]}"
    token_file.write_text(d.token_host + "\n")
    spooled = subprocess.run([sys.executable, "-m", "services.cli", "publish", "--drain-timeout", "0.5", "--run",
                              outside, str(src)], cwd=REPO, env=_tap_env(d, f"http://127.0.0.1:{free_port()}", token_file),
                             capture_output=True, text=True, timeout=60)
    assert spooled.returncode == 1, spooled.stderr
    started = time.monotonic()
    drained = subprocess.run([sys.executable, "-m", "services.cli", "spool", "--drain"], cwd=REPO,
                             env=_tap_env(d, d.gateway.url, token_file), capture_output=True, text=True, timeout=60)
    assert drained.returncode == UNDELIVERED_EXIT, drained.stderr
    assert time.monotonic() - started < 30, drained.stderr  # no 30 s refusal retry waited for
    assert f"run {run}: delivered" in drained.stderr
    assert "the gateway refused the run key (403" in drained.stderr and f"spool --discard {outside}" in drained.stderr
    assert [f[b"line"] for _, f in d.raw() if f[b"run"] == run.encode() and f[b"kind"] == b"line"] == [b"one", b"two"]
    assert not [f for _, f in d.raw() if f[b"run"] == outside.encode()]
    # what the last line says to do (it also leaves the shared spool empty for the other tests' drains)
    gone = subprocess.run([sys.executable, "-m", "services.cli", "spool", "--discard", outside], cwd=REPO,
                          env=_tap_env(d, d.gateway.url, token_file), capture_output=True, text=True, timeout=60)
    assert gone.returncode == 0 and f"run {outside}: discarded (3 entries" in gone.stderr, gone.stderr


def test_the_first_tap_as_documented_needs_no_run_and_lands_in_the_tokens_prefix(deployment, tmp_path):
    """`tokens create --token-file` prints the tap's configuration; the tap run exactly so (no --run)
    stores its run under the token's prefix, learnt from the gateway, or from the token file while the
    gateway is out of reach."""
    d = deployment
    token_file = tmp_path / "token"
    env = cli_env(d.settings, **d.creds("admin"))
    out = subprocess.run([sys.executable, "-m", "services.cli", "tokens", "create", "--prefix", "team-a/first/",
                          "--endpoint", d.gateway.url, "--token-file", str(token_file)], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "" and oct(token_file.stat().st_mode & 0o777) == "0o600"
    assert f"export GOOSE_INGEST_ENDPOINT={d.gateway.url}" in out.stderr
    assert f"export GOOSE_INGEST_TOKEN_FILE={token_file}" in out.stderr and "team-a/first/<host>/<ULID>" in out.stderr
    assert token_file.read_text().splitlines()[1] == "prefix: team-a/first/"
    # exactly as printed: the two variables and nothing else of ours (default namespace, shards, spool dir)
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path / "home")}
    env.update(line.strip().removeprefix("export ").split("=", 1)
               for line in out.stderr.splitlines() if line.strip().startswith("export "))
    assert sorted(env) == ["GOOSE_INGEST_ENDPOINT", "GOOSE_INGEST_TOKEN_FILE", "HOME", "PATH"]
    out = subprocess.run([sys.executable, "-m", "services.cli", "tap", "--quiet", "--", "cat", str(FIXTURE)],
                         cwd=REPO, env=env, capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr.decode()
    runs = {f[b"run"].decode() for _, f in d.raw() if f[b"run"].startswith(b"team-a/first/")}
    assert len(runs) == 1 and next(iter(runs)).startswith(f"team-a/first/{socket.gethostname()}/"), runs
    # the entries were spooled under the default spool directory of that HOME, and are delivered
    assert (tmp_path / "home" / ".local" / "state" / "goose-ingest" / "spool").is_dir()
    # the gateway out of reach: the prefix comes from the token file, and the entries wait in the spool
    env = _tap_env(d, f"http://127.0.0.1:{free_port()}", token_file)
    out = subprocess.run([sys.executable, "-m", "services.cli", "tap", "--quiet", "--drain-timeout", "0.5", "--",
                          "echo", "hello"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert "publish --run team-a/first/test-host/" in out.stderr, out.stderr
    listed = subprocess.run([sys.executable, "-m", "services.cli", "spool"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=60)
    waiting = [line.split()[0] for line in listed.stdout.splitlines() if line.startswith("team-a/first/")]
    assert len(waiting) == 1, listed
    # `spool --drain` delivers through the configured gateway; `--discard` removes a run for good
    env = _tap_env(d, d.gateway.url, token_file)
    drained = subprocess.run([sys.executable, "-m", "services.cli", "spool", "--drain"], cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=60)
    assert drained.returncode == 0 and f"run {waiting[0]}: delivered" in drained.stderr, drained.stderr
    assert [f[b"line"] for _, f in d.raw() if f[b"run"] == waiting[0].encode() and f[b"kind"] == b"line"] == [b"hello"]
    env = _tap_env(d, f"http://127.0.0.1:{free_port()}", token_file)
    subprocess.run([sys.executable, "-m", "services.cli", "tap", "--quiet", "--drain-timeout", "0.2", "--",
                    "echo", "never"], cwd=REPO, env=env, capture_output=True, timeout=60)
    listed = subprocess.run([sys.executable, "-m", "services.cli", "spool"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=60)
    stuck = [line.split()[0] for line in listed.stdout.splitlines() if line.startswith("team-a/first/")]
    assert len(stuck) == 1
    gone = subprocess.run([sys.executable, "-m", "services.cli", "spool", "--discard", stuck[0]], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert gone.returncode == 0 and "discarded (2 entries were not delivered)" in gone.stderr, gone.stderr
    listed = subprocess.run([sys.executable, "-m", "services.cli", "spool"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=60)
    assert stuck[0] not in listed.stdout
    again = subprocess.run([sys.executable, "-m", "services.cli", "spool", "--discard", stuck[0]], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 1 and "not in the spool" in again.stderr


def _publish_through(d: Deployment, endpoint: str, token_file: Path, run: str, src: Path,
                     **extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "services.cli", "publish", "--run", run, str(src)], cwd=REPO,
                            env=_tap_env(d, endpoint, token_file, **extra), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)


def test_a_backlog_of_big_lines_after_an_outage_is_delivered_whole_in_bodies_below_the_limit(deployment, tmp_path):
    """Issue 34's first case: 60 lines of 800 KB spooled while the gateway is down (a batch of 48 MB,
    three times its body limit) are all stored once it is back: 67 of 67 entries, in order."""
    d = deployment
    token_file = tmp_path / "token"
    token_file.write_text(d.token_host + "\n")
    port = free_port()
    run = f"team-a/laptop-42/{uuid4().hex[:8]}"
    lines = [f"small {i}" for i in range(3)] + [f"{i:04d}" + "x" * 800_000 for i in range(60)] + \
        [f"small {i}" for i in range(3, 6)]
    src = tmp_path / "in.txt"
    src.write_text("\n".join(lines) + "\n")
    pub = _publish_through(d, f"http://127.0.0.1:{port}", token_file, run, src)
    gw2 = None
    try:
        time.sleep(2.0)
        assert pub.poll() is None  # the gateway is down: spooled, waiting
        gw2 = start_gateway(d.settings, tmp_path / "gw2.log", port=port, **d.creds("gateway"))
        out, _ = pub.communicate(timeout=120)
        assert pub.returncode == 0, out.decode()[-2000:]
    finally:
        if pub.poll() is None:
            pub.kill()
        if gw2 is not None:
            stop(gw2.proc)
    stored = [f for _, f in d.raw() if f[b"run"] == run.encode()]
    assert [int(f[b"seq"]) for f in stored] == list(range(67))  # 67 of 67, none twice
    assert [f[b"line"].decode() for f in stored[:-1]] == lines and stored[-1][b"kind"] == b"eof"
    assert b"413" not in out, out.decode()[-2000:]  # no body was refused whole: the tap cut them below the limit


def test_a_line_the_gateway_can_never_take_is_kept_cut_and_dead_lettered_and_the_run_goes_on(deployment, tmp_path):
    """Issue 34's second case: one 17 MiB line (more than a whole body) among ten entries: 11 of 11 are in
    the raw log, as with a direct tap; the big one cut to MAX_LINE_BYTES, which the workers' reading
    (parse_batch) dead-letters as oversize and reports as the run's lost seq instead of waiting for it."""
    from services.sequencer.entries import Rejected, parse_batch
    from services.sequencer.feed import rejected_loss

    d = deployment
    token_file = tmp_path / "token"
    token_file.write_text(d.token_host + "\n")
    run = f"team-a/laptop-42/{uuid4().hex[:8]}"
    big = "é" + "y" * (17 << 20)
    lines = [f"before {i}" for i in range(5)] + [big] + [f"after {i}" for i in range(4)]
    src = tmp_path / "in.txt"
    src.write_text("\n".join(lines) + "\n")
    pub = _publish_through(d, d.gateway.url, token_file, run, src)
    out, _ = pub.communicate(timeout=120)
    assert pub.returncode == 0, out.decode()[-2000:]
    stored = [(sid, f) for sid, f in d.raw() if f[b"run"] == run.encode()]
    assert [int(f[b"seq"]) for _, f in stored] == list(range(11))  # 11 of 11
    fields = [f for _, f in stored]
    assert [f[b"line"].decode() for f in fields[:5] + fields[6:10]] == lines[:5] + lines[6:]
    limit = d.settings.max_line_bytes
    assert len(fields[5][b"line"]) == limit and fields[5][b"line"] == big.encode()[:limit]
    got = parse_batch([sid.decode() for sid, _ in stored], fields, limit)
    assert isinstance(got[5], Rejected) and got[5].reason == "oversize"
    lost = rejected_loss(got[5], fields[5], stored[5][0].decode())
    assert lost is not None and (lost.run, lost.seq) == (run, 5)
    assert not any(isinstance(g, Rejected) for i, g in enumerate(got) if i != 5)
    assert b"sent cut" in out and b"dead-letter" in out


def test_a_body_the_gateway_refuses_whole_is_split_down_to_the_entry_it_cannot_take(deployment, tmp_path):
    """A gateway with a smaller body limit than the tap assumed: the 413 splits the body; an entry alone
    over the limit is refused for good (logged with its seq) and the later entries are stored."""
    d = deployment
    gw2 = start_gateway(d.settings, tmp_path / "gw2.log", GOOSE_INGEST_GATEWAY_MAX_BODY_BYTES="65536",
                        GOOSE_INGEST_MAX_LINE_BYTES="100000", **d.creds("gateway"))
    try:
        token_file = tmp_path / "token"
        token_file.write_text(d.token_host + "\n")
        run = f"team-a/laptop-42/{uuid4().hex[:8]}"
        # the tap's own settings say nothing of the gateway's limits: it learns them from the replies
        lines = [f"{i:03d}" + "z" * 20_000 for i in range(12)]
        lines[7] = "w" * 90_000  # under the entry limit, over the body limit: never takeable
        src = tmp_path / "in.txt"
        src.write_text("\n".join(lines) + "\n")
        pub = _publish_through(d, gw2.url, token_file, run, src)
        out, _ = pub.communicate(timeout=120)
        assert pub.returncode == 0, out.decode()[-2000:]
    finally:
        stop(gw2.proc)
    stored = [f for _, f in d.raw() if f[b"run"] == run.encode()]
    assert [int(f[b"seq"]) for f in stored] == [i for i in range(13) if i != 7]
    assert b"refused entry seq 7 for good (413" in out, out.decode()[-2000:]
    # kept beside the spool with its reason, listed by `spool`, gone with `spool --discard RUN`
    env = _tap_env(d, d.gateway.url, token_file)
    listed = subprocess.run([sys.executable, "-m", "services.cli", "spool"], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=60)
    line = next(x for x in listed.stdout.splitlines() if x.startswith(run + " "))
    assert "1 entries refused by the gateway for good, kept in " in line, listed.stdout
    kept = [orjson.loads(x) for x in Path(line.rsplit(" kept in ", 1)[1]).read_bytes().splitlines()]
    assert [(k["entry"]["seq"], k["entry"]["line"], k["reason"][:4]) for k in kept] == [("7", lines[7], "413:")]
    gone = subprocess.run([sys.executable, "-m", "services.cli", "spool", "--discard", run], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert gone.returncode == 0 and "discarded its entries refused by the gateway" in gone.stderr, gone.stderr
    listed = subprocess.run([sys.executable, "-m", "services.cli", "spool"], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=60)
    assert run not in listed.stdout


def test_a_second_gateway_on_a_busy_port_names_the_gateways_port_setting(deployment, tmp_path):
    d = deployment
    port = d.gateway.url.rsplit(":", 1)[1]
    out = subprocess.run([sys.executable, "-m", "services.cli", "gateway", "--host", "127.0.0.1", "--port", port],
                         cwd=REPO, env=cli_env(d.settings, **d.creds("gateway")), capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert f"gateway address 127.0.0.1:{port} is already in use" in out.stderr
    assert "GOOSE_INGEST_GATEWAY_PORT" in out.stderr and "METRICS_PORT" not in out.stderr


def test_the_tap_only_distribution_installs_alone_and_delivers_through_a_gateway(deployment, fixture_db, tmp_path):
    """packaging/tap/build.py's wheel in a clean venv with only its declared dependencies: `--version`,
    `--help` and a command of the full install answer in one line, and `publish` and `import-sessions`
    deliver through the gateway (issue 34 item 6)."""
    from tests.tap.test_import_sessions import LATER, SID

    d = deployment
    built = subprocess.run([sys.executable, str(REPO / "packaging" / "tap" / "build.py"), "--out", str(tmp_path / "dist")],
                           capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr
    wheel = Path(built.stdout.strip())
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", str(wheel)], capture_output=True, text=True,
                         timeout=600)
    if pip.returncode != 0 and ("Could not find a version" in pip.stderr or "No matching distribution" in pip.stderr):
        missing("a package index with pydantic, pydantic-settings, orjson and hiredis", "pip's configured index")
    assert pip.returncode == 0, pip.stderr[-2000:]
    listed = subprocess.run([str(venv / "bin" / "pip"), "list", "--format=freeze"], capture_output=True, text=True,
                            timeout=120).stdout.lower()
    names = {line.split("==")[0] for line in listed.splitlines()}
    assert not names & {"redis", "faststream", "starlette", "uvicorn", "psycopg", "opentelemetry-sdk", "pyarrow"}, names
    assert {"pydantic", "pydantic-settings", "orjson", "hiredis", "goose-ingest-tap"} <= names, names
    cli = str(venv / "bin" / "goose-ingest")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GOOSE_INGEST_")}
    version = subprocess.run([cli, "--version"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and "(tap only)" in version.stdout, version.stderr
    helped = subprocess.run([cli, "--help"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert helped.returncode == 0 and "needs the full install" in helped.stdout, helped.stderr
    for command in (["worker"], ["gateway"], ["tokens", "list"]):
        out = subprocess.run([cli, *command], cwd=tmp_path, env={**env, "GOOSE_INGEST_REDIS_URL": "redis://127.0.0.1:1/0"},
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, (command, out.stderr)
        assert "needs the full install" in out.stderr and "Traceback" not in out.stderr
    token_file = tmp_path / "token"
    token_file.write_text(d.token_a)
    src = tmp_path / "in.txt"
    src.write_text("from the tap-only install\n")
    run = f"team-a/taponly/{uuid4().hex[:8]}"
    tap_env = {**env, "GOOSE_INGEST_ENDPOINT": d.gateway.url, "GOOSE_INGEST_TOKEN_FILE": str(token_file),
               "GOOSE_INGEST_NAMESPACE": d.settings.namespace, "GOOSE_INGEST_SHARDS": str(d.settings.shards),
               "GOOSE_INGEST_SPOOL_DIR": str(tmp_path / "spool")}
    out = subprocess.run([cli, "publish", "--run", run, str(src)], cwd=tmp_path, env=tap_env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert [f.get(b"line") for _, f in d.raw() if f[b"run"] == run.encode()] == [b"from the tap-only install", None]
    # import-sessions through the gateway: no redis-py needed (a namespace of its own: the other import
    # test of this module expects its run key unused)
    ns = f"taponly-{uuid4().hex[:6]}"
    admin = redis.Redis(port=d.server.port, username=user_name("admin", d.settings.namespace),
                        password=d.passwords["admin"], socket_timeout=10)
    token_file.write_text(tokens.create(admin, d.settings.layout, f"{ns}/", {})[0])
    out = subprocess.run([cli, "import-sessions", str(fixture_db), "--namespace", ns, "--no-progress", "--now", LATER],
                         cwd=tmp_path, env=tap_env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "published 19 message(s)" in out.stderr, out.stderr
    assert len([f for _, f in d.raw() if f[b"run"] == f"{ns}/{SID}".encode()]) == 21  # 19 messages, complete, eof


def test_gateway_without_a_broker_is_a_one_line_config_error():
    env = {k: v for k, v in os.environ.items() if not k.startswith("GOOSE_INGEST_")}
    out = subprocess.run([sys.executable, "-m", "services.cli", "gateway"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1 and "REDIS_URL" in out.stderr


def test_tokens_command_creates_lists_and_revokes_without_showing_the_token_again(tmp_path):
    server = start_redis(dir=str(tmp_path / "redis"))
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GOOSE_INGEST_")}
        env.update(GOOSE_INGEST_REDIS_URL=server.url, GOOSE_INGEST_NAMESPACE="tok")

        def cli(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run([sys.executable, "-m", "services.cli", "tokens", *args], cwd=REPO, env=env,
                                  capture_output=True, text=True, timeout=60)

        made = cli("create", "--prefix", "team-a/laptop-42/", "--host", "laptop-42", "--note", "dev laptop")
        assert made.returncode == 0, made.stderr
        token = made.stdout.strip()
        token_id = tokens.token_id_of(token)
        assert token_id and f"id: {token_id}" in made.stderr
        listed = cli("list")
        assert listed.returncode == 0 and token_id in listed.stdout and "team-a/laptop-42/" in listed.stdout
        assert listed.stdout.splitlines()[0].split("\t") == ["ID", "PREFIX", "LABELS", "CREATED", "NOTE"]
        assert secret_of(token) not in listed.stdout
        stored = redis.Redis(port=server.port).hgetall(f"tok:goose-ingest:token:{token_id}")
        assert token.encode() not in b"".join(stored.values()) and stored[b"sha256"] == tokens.token_hash(token).encode()
        bad = cli("create", "--prefix", "no-slash")
        assert bad.returncode == 2 and "--prefix" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
        assert cli("revoke", token_id).returncode == 0
        client = redis.Redis(port=server.port)
        assert tokens.list_tokens(client, Settings(namespace="tok").layout) == []
        assert not tokens.revoke(client, Settings(namespace="tok").layout, token_id)  # the command's exit 1
    finally:
        server.close()


def test_a_gateway_killed_mid_stream_loses_nothing_and_the_workers_see_no_double(deployment, tmp_path):
    """SIGKILL the gateway while a tap streams through it, start another on the same port: the tap
    resends what was not confirmed; every seq arrives, and any entry stored twice (stored, then the
    200 lost with the process) is the identical copy the workers drop by (run, seq)."""
    d = deployment
    token_file = tmp_path / "token"
    token_file.write_text(d.token_a)
    port = free_port()
    creds = {"GOOSE_INGEST_REDIS_USERNAME": user_name("gateway", d.settings.namespace),
             "GOOSE_INGEST_REDIS_PASSWORD": d.passwords["gateway"]}
    gw = start_gateway(d.settings, tmp_path / "gw-a.log", port=port, **creds)
    run = f"team-a/kill/{uuid4().hex[:8]}"
    n = 2000
    script = f"import time\nfor i in range({n}):\n    print(f'line {{i}}', flush=True)\n    time.sleep(0.001)\n"
    env = _tap_env(d, f"http://127.0.0.1:{port}", token_file, GOOSE_INGEST_PUBLISH_BATCH="50")
    tap = subprocess.Popen([sys.executable, "-m", "services.cli", "tap", "--quiet", "--run", run, "--", sys.executable,
                            "-c", script], cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    gw2 = None
    try:
        wait_until(lambda: len([1 for _, f in d.raw() if f[b"run"] == run.encode()]) > 200, timeout=30, interval=0.05)
        gw.proc.kill()
        gw.proc.wait()
        time.sleep(0.5)
        gw2 = start_gateway(d.settings, tmp_path / "gw-b.log", port=port, **creds)
        _, err = tap.communicate(timeout=90)
        assert tap.returncode == 0, err.decode()
    finally:
        if tap.poll() is None:
            tap.kill()
        stop(gw.proc)
        if gw2 is not None:
            stop(gw2.proc)
    stored = [f for _, f in d.raw() if f[b"run"] == run.encode()]
    by_seq: dict[int, dict] = {}
    for f in stored:
        seq = int(f[b"seq"])
        assert by_seq.setdefault(seq, f) == f  # a copy is identical: the workers drop it
    assert sorted(by_seq) == list(range(n + 1))  # 0 lost (the lines and the eof)
    assert [by_seq[i][b"line"] for i in range(n)] == [f"line {i}".encode() for i in range(n)]


def test_the_tap_verifies_a_tls_gateway_with_its_ca_file(deployment, tmp_path):
    """GATEWAY_TLS_* serve HTTPS; the tap trusts it with ENDPOINT_CA_FILE, and without it refuses the
    certificate (spools, delivers nothing) -- one test for both ends of the TLS option."""
    from tests.support.tls import make_tls_files

    d = deployment
    files = make_tls_files(tmp_path / "tls")
    port = free_port()
    creds = {"GOOSE_INGEST_REDIS_USERNAME": user_name("gateway", d.settings.namespace),
             "GOOSE_INGEST_REDIS_PASSWORD": d.passwords["gateway"]}
    log = tmp_path / "gw-tls.log"
    proc = subprocess.Popen([sys.executable, "-m", "services.cli", "gateway", "--host", "127.0.0.1", "--port", str(port)],
                            cwd=REPO, stdout=log.open("ab"), stderr=subprocess.STDOUT,
                            env=cli_env(d.settings, GOOSE_INGEST_GATEWAY_TLS_CERT_FILE=str(files.server_cert),
                                        GOOSE_INGEST_GATEWAY_TLS_KEY_FILE=str(files.server_key), **creds))
    try:
        wait_until(lambda: "listening on https://" in log.read_text(), timeout=30)
        token_file = tmp_path / "token"
        token_file.write_text(d.token_a)
        src = tmp_path / "in.txt"
        src.write_text("one\ntwo\n")
        endpoint = f"https://localhost:{port}"
        untrusted = f"team-a/tls/{uuid4().hex[:8]}"
        out = subprocess.run([sys.executable, "-m", "services.cli", "publish", "--drain-timeout", "1", "--run", untrusted,
                              str(src)], cwd=REPO, env=_tap_env(d, endpoint, token_file), capture_output=True, timeout=60)
        assert out.returncode == 1 and b"CERTIFICATE_VERIFY_FAILED" in out.stderr, out.stderr.decode()
        trusted = f"team-a/tls/{uuid4().hex[:8]}"
        out = subprocess.run([sys.executable, "-m", "services.cli", "publish", "--run", trusted, str(src)], cwd=REPO,
                             env=_tap_env(d, endpoint, token_file, GOOSE_INGEST_ENDPOINT_CA_FILE=str(files.ca)),
                             capture_output=True, timeout=60)
        assert out.returncode == 0, out.stderr.decode()
        runs = [f[b"run"] for _, f in d.raw()]
        assert runs.count(trusted.encode()) == 3 and untrusted.encode() not in runs
    finally:
        stop(proc)


def _raise_fd_limit(wanted: int) -> int:
    """Raise this process's soft open-files limit towards ``wanted`` (a child inherits it): the limit now."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < wanted:
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_ten_thousand_idle_connections_cost_bounded_memory_and_one_more_than_the_limit_gets_503(deployment, tmp_path):
    """10,000 idle connections (fewer, but at least 2,000, where the fd limit does not allow it): /healthz
    answers and a real batch is stored meanwhile, at a few KiB of RSS per connection; beyond
    GATEWAY_MAX_CONNECTIONS a request gets a clear 503 and is written nowhere."""
    d = deployment
    limit = _raise_fd_limit(10_000 + 500)  # this process holds the client ends; the gateway inherits the limit
    n = min(10_000, limit - 500)
    if n < 2_000:
        missing(f"an open-files limit of 2,500 (this machine allows {limit})", "ulimit -n 10500, or raise the hard limit")
    creds = {"GOOSE_INGEST_REDIS_USERNAME": user_name("gateway", d.settings.namespace),
             "GOOSE_INGEST_REDIS_PASSWORD": d.passwords["gateway"]}
    gw = start_gateway(d.settings, tmp_path / "gw.log", GOOSE_INGEST_GATEWAY_MAX_CONNECTIONS=str(n + 20), **creds)
    host, port = gw.url.removeprefix("http://").split(":")
    socks: list[socket.socket] = []
    try:
        rss_before = _rss_kib(gw.proc.pid)
        for _ in range(n):
            socks.append(socket.create_connection((host, int(port)), timeout=10))
        wait_until(lambda: _rss_kib(gw.proc.pid) - rss_before > n, timeout=30)  # accepted (>= 1 KiB each)
        started = time.monotonic()
        assert gw.get("/healthz")[0] == 200
        assert time.monotonic() - started < 5
        run = f"team-a/conns/{uuid4().hex[:8]}"
        status, reply, _ = gw.post(ndjson([{"run": run, "seq": i, "line": f"l{i}"} for i in range(50)]), d.token_a)
        assert status == 200 and reply["stored"] == 50, reply
        grown = _rss_kib(gw.proc.pid) - rss_before
        assert grown < 20 * n, f"{grown} KiB for {n} idle connections"
        for _ in range(30):  # past GATEWAY_MAX_CONNECTIONS
            socks.append(socket.create_connection((host, int(port)), timeout=10))
        time.sleep(0.5)
        late = f"team-a/conns/{uuid4().hex[:8]}"
        status, _, _ = _post_no_json(gw, ndjson([{"run": late, "seq": 0, "line": "x"}]), d.token_a)
        assert status == 503
        assert not [f for _, f in d.raw() if f.get(b"run") == late.encode()]
        assert gw.proc.poll() is None
    finally:
        for s in socks:
            s.close()
        stop(gw.proc)


def _post_no_json(gw: Gateway, body: bytes, token: str) -> tuple[int, bytes, dict[str, str]]:
    """POST whose reply may not be JSON (uvicorn's own 503 is text): (status, body, headers)."""
    req = urllib.request.Request(gw.url + "/v1/raw", data=body, method="POST",
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/x-ndjson"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read(), dict(resp.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), dict(exc.headers)


def test_the_host_checkpoint_file_replays_appends_and_survives_a_torn_last_line(tmp_path):
    from services.backfill.importer import Checkpoint, CheckpointFileError, FileCheckpoints
    from services.backfill.sessions_db import SessionInfo

    path = tmp_path / "state" / "ns.jsonl"
    session = SessionInfo("s1", None, None, None, None, None)
    store = FileCheckpoints(path)
    assert store.load("ns/s1") == Checkpoint()
    store.save("ns/s1", Checkpoint("ns/s1", 1, 3, False, 1000, {}, {"a", "b", "c"}), ["a", "b", "c"], session)
    store.save("ns/s1", Checkpoint("ns/s1", 1, 5, True, 2000, {"total_tokens": 7}, {"a", "b", "c", "d"}), ["d"], session)
    store.close()
    with path.open("ab") as f:
        f.write(b'{"base":"ns/s1","run":"ns/s1","part":1,"next_')  # a crash in the middle of an append
    store = FileCheckpoints(path)
    cp = store.load("ns/s1")
    assert (cp.run, cp.next_seq, cp.ended, cp.reported, cp.ids) == ("ns/s1", 5, True, {"total_tokens": 7}, set("abcd"))
    assert path.read_bytes().endswith(b"\n")  # the torn line was cut off: the next append starts a line
    with pytest.raises(CheckpointFileError, match="in use"):
        FileCheckpoints(path)
    store.close()
    path.write_bytes(b"not json\n" + path.read_bytes())
    with pytest.raises(CheckpointFileError, match="line 1 is damaged"):
        FileCheckpoints(path)


def test_import_sessions_through_the_gateway_keeps_its_checkpoints_in_a_host_file(deployment, fixture_db, tmp_path):
    """gateway process + worker process + import-sessions process without any broker credential: the
    session's events are exactly those of a direct import; the checkpoints live in the host's state
    file, so a second import publishes nothing; the importer needs no Redis user at all."""
    from tests.tap.test_import_sessions import LATER, NS, SID, db_expected, strip

    d = deployment
    admin = redis.Redis(port=d.server.port, username=user_name("admin", d.settings.namespace),
                        password=d.passwords["admin"], socket_timeout=10)
    token, _ = tokens.create(admin, d.settings.layout, f"{NS}/", {})
    token_file = tmp_path / "token"
    token_file.write_text(token)
    spool = tmp_path / "host-spool"
    env = _tap_env(d, d.gateway.url, token_file, GOOSE_INGEST_SPOOL_DIR=str(spool))
    for k in PROXY_VARS:
        env.pop(k, None)
    run = f"{NS}/{SID}"
    # another deployment's run of the same key may be in the shared Redis from an earlier test: none here
    assert not [f for _, f in d.raw() if f.get(b"run") == run.encode()]

    def import_sessions() -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "services.cli", "import-sessions", str(fixture_db), "--namespace",
                               NS, "--no-progress", "--now", LATER], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=120)

    first = import_sessions()
    assert first.returncode == 0 and "published 19 message(s)" in first.stderr, first.stderr
    state = spool / "import-sessions" / f"{NS}.jsonl"
    records = [orjson.loads(line) for line in state.read_bytes().splitlines()]
    assert [(r["base"], r["run"], r["ended"], len(r["ids"])) for r in records] == [(run, run, True, 19)]
    again = import_sessions()
    assert again.returncode == 0 and "published 0 message(s)" in again.stderr, again.stderr
    assert len([f for _, f in d.raw() if f.get(b"run") == run.encode()]) == 21  # 19 messages, complete, eof
    worker = start_worker(d.settings, tmp_path / "worker.log", **d.creds("worker"))
    try:
        def ended() -> bool:
            r = d.root()
            return any(f[b"runId"] == run.encode() and f[b"state"] == b"ended"
                       for s in d.settings.layout.runs_partitions() for _, f in r.xrange(s))

        wait_until(ended, timeout=60)
    finally:
        stop(worker)
    r = d.root()
    got = [e for e in (orjson.loads(f[b"data"]) for s in d.settings.layout.events_partitions() for _, f in r.xrange(s))
           if e["runId"] == run]
    assert strip(got) == strip(db_expected(fixture_db, SID, run)) and got
    # a second import at once on the same state file is refused with one line (exit 2), nothing sent
    from services.backfill.importer import FileCheckpoints

    held = FileCheckpoints(state)
    try:
        busy = import_sessions()
        assert busy.returncode == 2 and "in use by another import-sessions" in busy.stderr, busy.stderr
    finally:
        held.close()


def test_import_sessions_through_the_gateway_with_a_wrong_token_prefix_or_no_gateway_is_one_line_exit_2(
        deployment, fixture_db, tmp_path):
    from tests.tap.test_import_sessions import LATER, NS

    d = deployment
    token_file = tmp_path / "token"
    fake = "gik_0123456789ab_" + "S" * 43
    token_file.write_text(fake)
    before = d.raw_count()
    for endpoint, says in ((d.gateway.url, "the gateway refused the token (401"), (f"http://127.0.0.1:{free_port()}", "unreachable")):
        env = _tap_env(d, endpoint, token_file, GOOSE_INGEST_SPOOL_DIR=str(tmp_path / "spool"))
        for k in PROXY_VARS:
            env.pop(k, None)
        out = subprocess.run([sys.executable, "-m", "services.cli", "import-sessions", str(fixture_db), "--namespace",
                              NS, "--no-progress", "--now", LATER], cwd=REPO, env=env, capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1 and says in out.stderr, out.stderr
        assert "SSSS" not in out.stderr
    # a valid token whose prefix does not cover NS/<session id>: every batch would be a 403
    token_file.write_text(d.token_b)
    env = _tap_env(d, d.gateway.url, token_file, GOOSE_INGEST_SPOOL_DIR=str(tmp_path / "spool"))
    for k in PROXY_VARS:
        env.pop(k, None)
    out = subprocess.run([sys.executable, "-m", "services.cli", "import-sessions", str(fixture_db), "--namespace",
                          NS, "--no-progress", "--now", LATER], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "the token's prefix 'team-b/' does not cover" in out.stderr and f"--prefix {NS}/" in out.stderr
    assert d.raw_count() == before
    assert not (tmp_path / "spool" / "import-sessions").exists()  # nothing recorded, nothing spooled


def test_a_token_revoked_mid_import_stops_the_import_instead_of_waiting_for_ever(deployment, fixture_db, tmp_path):
    """The start-up probe took the token; it is revoked before the first batch (the importer driven directly,
    the gateway real): the import stops with the 401 as DeliveryRefused -- one line, exit 2 from the command --
    the run's entries stay spooled and no checkpoint claims them. Before, flush() retried it every 30 s for
    ever."""
    from services.backfill.importer import DeliveryRefused, FileCheckpoints, Importer, parse_since
    from services.backfill.sessions_db import list_sessions, open_readonly
    from tests.tap.test_import_sessions import LATER

    d = deployment
    ns = f"revoked-{uuid4().hex[:6]}"
    admin = redis.Redis(port=d.server.port, username=user_name("admin", d.settings.namespace),
                        password=d.passwords["admin"], socket_timeout=10)
    token, rec = tokens.create(admin, d.settings.layout, f"{ns}/", {})
    assert tokens.revoke(admin, d.settings.layout, rec.id)
    time.sleep(1.0)  # past the deployment's GATEWAY_TOKEN_CACHE_S (0.5 s)
    settings = Settings(endpoint=d.gateway.url, token=token, namespace=d.settings.namespace, shards=2,
                        spool_dir=str(tmp_path / "spool"))
    state = tmp_path / "state.jsonl"
    conn = open_readonly(str(fixture_db))
    importer = Importer(settings, conn, ns, None, now_s=parse_since(LATER).timestamp(),
                        checkpoints=FileCheckpoints(state))
    started = time.monotonic()
    with pytest.raises(DeliveryRefused, match=r"the gateway refused the token \(401.*stay spooled in "):
        importer.import_session(list_sessions(conn)[0])
    assert time.monotonic() - started < 20  # not the 30 s refusal retry, let alone for ever
    assert not state.exists() or not state.read_bytes().strip()  # no checkpoint covers the undelivered
    assert not [f for _, f in d.raw() if f[b"run"].startswith(f"{ns}/".encode())]
    assert any((tmp_path / "spool").rglob("*")), "the entries stay spooled"


PROXY_VARS = ("http_proxy", "https_proxy", "no_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY")


def test_the_tap_goes_through_the_proxy_of_the_standard_variables_and_honours_no_proxy(deployment, tmp_path):
    """A real proxy on loopback (tests/support/http_proxy.py): http:// through it with absolute-form requests
    (and the proxy URL's credentials as Proxy-Authorization), https:// through a CONNECT tunnel with TLS
    end to end, and NO_PROXY naming the gateway's host goes around it."""
    from tests.support.http_proxy import HttpProxy
    from tests.support.tls import make_tls_files

    d = deployment
    token_file = tmp_path / "token"
    token_file.write_text(d.token_a)
    src = tmp_path / "in.txt"
    src.write_text("one\ntwo\n")
    files = make_tls_files(tmp_path / "tls")
    port = free_port()
    creds = {"GOOSE_INGEST_REDIS_USERNAME": user_name("gateway", d.settings.namespace),
             "GOOSE_INGEST_REDIS_PASSWORD": d.passwords["gateway"]}
    log = tmp_path / "gw-tls.log"
    tls_gw = subprocess.Popen([sys.executable, "-m", "services.cli", "gateway", "--host", "127.0.0.1", "--port", str(port)],
                              cwd=REPO, stdout=log.open("ab"), stderr=subprocess.STDOUT,
                              env=cli_env(d.settings, GOOSE_INGEST_GATEWAY_TLS_CERT_FILE=str(files.server_cert),
                                          GOOSE_INGEST_GATEWAY_TLS_KEY_FILE=str(files.server_key), **creds))

    def publish(endpoint: str, **proxy_env: str) -> str:
        run = f"team-a/proxy/{uuid4().hex[:8]}"
        env = _tap_env(d, endpoint, token_file, GOOSE_INGEST_ENDPOINT_CA_FILE=str(files.ca))
        for k in PROXY_VARS:
            env.pop(k, None)
        env.update(proxy_env)
        out = subprocess.run([sys.executable, "-m", "services.cli", "publish", "--drain-timeout", "20", "--run", run,
                              str(src)], cwd=REPO, env=env, capture_output=True, timeout=60)
        assert out.returncode == 0, out.stderr.decode()
        assert b"proxy-pw" not in out.stderr
        assert [f.get(b"line") for _, f in d.raw() if f.get(b"run") == run.encode()] == [b"one", b"two", None]  # + eof
        return run

    try:
        wait_until(lambda: "listening on https://" in log.read_text(), timeout=30)
        gw_host = d.gateway.url.removeprefix("http://")
        with HttpProxy() as proxy:
            publish(d.gateway.url, http_proxy=proxy.url.replace("http://", "http://tap:proxy-pw@"))
            # the start-up check (GET /v1/token), then the batches, all absolute-form through the proxy
            assert [(p.method, p.target) for p in proxy.passed][:2] == [
                ("GET", f"http://{gw_host}/v1/token"), ("POST", f"http://{gw_host}/v1/raw")], proxy.passed
            assert all(p.authorized for p in proxy.passed)
            proxy.passed.clear()
            publish(f"https://localhost:{port}", HTTPS_PROXY=proxy.url)
            # one tunnel for the start-up check, one for the batches
            assert [(p.method, p.target) for p in proxy.passed] == [("CONNECT", f"localhost:{port}")] * 2
            proxy.passed.clear()
            publish(d.gateway.url, HTTP_PROXY=proxy.url, NO_PROXY="localhost,127.0.0.1")
            publish(f"https://localhost:{port}", https_proxy=proxy.url, no_proxy="localhost")
            assert proxy.passed == []
    finally:
        stop(tls_gw)


@pytest.mark.parametrize("env, says", [
    ({"GOOSE_INGEST_ENDPOINT": "https://gw.example"}, "GOOSE_INGEST_TOKEN"),
    ({"GOOSE_INGEST_ENDPOINT": "ftp://gw.example", "GOOSE_INGEST_TOKEN": "gik_x"}, "must be an https://"),
    ({"GOOSE_INGEST_ENDPOINT": "https://gw.example", "GOOSE_INGEST_TOKEN_FILE": "/nonexistent"},
     "cannot read it"),
    ({"GOOSE_INGEST_ENDPOINT": "https://gw.example", "GOOSE_INGEST_TOKEN": "secret-token-value",
      "GOOSE_INGEST_ENDPOINT_CA_FILE": "/nonexistent"}, "GOOSE_INGEST_ENDPOINT_CA_FILE"),
], ids=["no-token", "not-http", "token-file-missing", "ca-file-missing"])
def test_a_misconfigured_gateway_tap_is_one_line_and_exit_2(tmp_path, env, says):
    base = {k: v for k, v in os.environ.items() if not k.startswith("GOOSE_INGEST_")}
    out = subprocess.run([sys.executable, "-m", "services.cli", "publish", "--run", "team-a/x", "-"], cwd=REPO,
                         env={**base, "GOOSE_INGEST_SPOOL_DIR": str(tmp_path / "spool"), **env},
                         input=b"line\n", capture_output=True, timeout=60)
    err = out.stderr.decode()
    assert out.returncode == 2 and len(err.strip().splitlines()) == 1 and says in err, err
    assert "secret-token-value" not in err
