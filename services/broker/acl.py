"""Redis ACL users of goose-ingest, one per role, each the least it needs (docs/architecture.md).

Key patterns come from the names of `contracts/keys.py` (`KeyLayout`: namespace prefix,
raw and control stream prefixes, topic names, key families), and cover the single-node and the
cluster layout alike (``goose.raw.*`` matches ``goose.raw.3`` and ``goose.raw.{s3}``), so one
file serves both; on a cluster every node loads it. `deploy/redis/users.acl` is `render()` of the
default settings (a test keeps them equal); `goose-ingest acl` renders it for the current
settings, with passwords.

Selectors (Redis >= 7.0) keep a command to the keys it is meant for: an exporter may XADD to its
own dead-letter stream but not to a topic, and may delete its own state but not a topic.

Each exporter has a user of its own (`otlp-exporter`, `postgres-exporter`): a credential of one
cannot write the other's state or dead letters (it could mark OTLP roots done, or forge the other's
dead letters). Redis ACLs cannot restrict consumer-group names, so what an exporter user can still
do to another group on the topics it reads (XACK, XCLAIM) is bounded by the topics only; the
read-only `consumer` has no group command at all (docs/architecture.md lists what each can do).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from contracts.consumers import BY_NAME as CONSUMER
from contracts.consumers import EXPORTERS as EXPORTERS
from contracts.consumers import JSONL, POSTGRES
from contracts.keys import (
    ACTIVE_RUNS,
    ARCHIVE,
    EXPORT_GROUP_OPEN,
    EXPORT_GROUP_STATE,
    EXPORT_OPEN,
    EXPORT_STATE,
    GATEWAY_TOKEN,
    IMPORT_CHECKPOINT,
    LEASE,
    META,
    RUN_STATE,
    SPREAD,
    WORKERS,
    KeyLayout,
)

# What every client needs to connect and find its way: handshake, liveness, client name
# (redis-py announces itself), and cluster topology discovery. Nothing here reads or writes data.
CONNECTION = (
    "+auth", "+hello", "+ping", "+echo", "+select", "+command", "+time",
    # CLIENT SETINFO (Redis >= 7.2) is left out so the file loads on 7.0; redis-py ignores its refusal.
    "+client|setname", "+client|getname", "+client|id",
    "+readonly", "+readwrite", "+asking",
    "+cluster|slots", "+cluster|shards", "+cluster|nodes", "+cluster|info", "+cluster|myid",
    "+multi", "+exec", "+discard",
)
# Reading a topic by id: what dashboards and ad-hoc readers (`tail`) need, and nothing that moves
# a consumer group (no XREADGROUP, XACK, XCLAIM, XGROUP: a reader cannot drain an exporter's group).
STREAM_READER = ("+xread", "+xrange", "+xrevrange", "+xlen", "+xinfo|stream", "+xinfo|groups", "+xinfo|consumers")
# Reading through a consumer group (the worker on the raw log, an exporter on the topics). Deliberately
# absent: XADD, XDEL, XTRIM, XSETID, XGROUP DESTROY / SETID (one consumer must not rewind or drop
# another's group).
STREAM_CONSUMER = (
    *STREAM_READER,
    "+xreadgroup", "+xack", "+xclaim", "+xpending",  # no XAUTOCLAIM: the one reclaim claims by id (streams/pending.py)
    "+xgroup|create", "+xgroup|createconsumer", "+xgroup|delconsumer",
)
HASH_RW = ("+hget", "+hmget", "+hgetall", "+hexists", "+hlen", "+hset", "+hsetnx", "+hdel", "+hincrby")
STRING_RW = ("+get", "+mget", "+set", "+setnx", "+incr", "+incrby")
KEY_LIFECYCLE = ("+exists", "+type", "+del", "+unlink", "+expire", "+pexpire", "+persist", "+ttl", "+pttl")
SCRIPTS = ("+eval", "+evalsha", "+eval_ro", "+evalsha_ro", "+script|load", "+script|exists")
META_READ = ("+get", "+hget", "+hgetall", "+exists", "+type")
# The first command of a deployment records its shard count (services/broker/cluster.py:
# ensure_shard_count); HSETNX only ever adds a missing field, it cannot change a recorded one.
META_RECORD = ("+hsetnx",)
SET_RW = ("+sadd", "+srem", "+smembers", "+sismember", "+smismember", "+scard")
ZSET_RW = ("+zadd", "+zrem", "+zrange", "+zrangebyscore", "+zscore", "+zcard", "+zcount")
# The exporters (services/export/*): each has a role `<name>-exporter` and may write only its own
# state (`export_group_state(<name>, ...)`, `export_group_open_runs(<name>, ...)`, and the state of
# before per-group state, `export_state(<name>, ...)`, `export_open_runs(<name>, ...)`, which it adopts)
# and dead letters (`<deadletter>.<name>`). Every group of an exporter runs under the exporter's user:
# Redis ACLs cannot tell groups apart, and a group name is configuration, not known to this file.
# EXPORTERS: the exporter rows of contracts/consumers.py.


def exporter_role(exporter: str) -> str:
    """The ACL role of an exporter (`otlp` -> `otlp-exporter`; its user `goose-otlp-exporter`): its
    row of contracts/consumers.py."""
    return CONSUMER[exporter].role


@dataclass(frozen=True)
class Role:
    name: str
    purpose: str
    rules: tuple[str, ...]  # ACL rules after `reset on <password>`: commands, key patterns, selectors


def glob_escape(name: str) -> str:
    """`name` as a literal inside a Redis glob pattern."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in name)


@dataclass(frozen=True)
class KeyPatterns:
    """Glob patterns of every key family of a layout (both layouts: single node and cluster)."""

    raw: str
    control: str
    topics: tuple[str, ...]  # harness.events[.*], harness.runs[.*]
    deadletter: tuple[str, ...]
    run_state: str
    active_runs: str
    import_checkpoint: str
    export_state: dict[str, tuple[str, ...]]  # exporter -> its per-run state keys (per group; from before)
    export_open: dict[str, tuple[str, ...]]  # exporter -> its open-run sets (per group; from before)
    export_deadletter: dict[str, tuple[str, ...]]  # exporter -> its dead-letter stream (partitions)
    meta: str
    lease: str
    archive: str
    workers: str
    spread: str
    gateway_token: str
    everything: str

    @classmethod
    def of(cls, layout: KeyLayout) -> KeyPatterns:
        def family(name: str) -> str:  # `<ns>:<name>:*`: per-run / per-shard keys of a family
            return glob_escape(layout.key(name + ":")) + "*"

        def topic(base: str) -> tuple[str, str]:  # the stream itself and its `.type` / `.{s3}` partitions
            return glob_escape(layout.key(base)), glob_escape(layout.key(base + ".")) + "*"

        return cls(
            raw=glob_escape(layout.key(layout.raw_prefix + ".")) + "*",
            control=glob_escape(layout.key(layout.control_prefix + ".")) + "*",
            topics=topic(layout.events_topic) + topic(layout.runs_topic),
            deadletter=topic(layout.deadletter_stream),
            run_state=family(RUN_STATE),
            # `goose-ingest:active` on a single node, `goose-ingest:active:{s3}` on a cluster
            active_runs=glob_escape(layout.key(ACTIVE_RUNS)) + "*",
            import_checkpoint=family(IMPORT_CHECKPOINT),
            export_state={name: (family(f"{EXPORT_GROUP_STATE}:{name}"), family(f"{EXPORT_STATE}:{name}"))
                          for name in EXPORTERS},
            # `<EXPORT_OPEN>:<name>` on a single node, `<EXPORT_OPEN>:<name>:{s3}` on a cluster
            export_open={name: (family(f"{EXPORT_GROUP_OPEN}:{name}"), glob_escape(layout.key(f"{EXPORT_OPEN}:{name}")),
                               family(f"{EXPORT_OPEN}:{name}"))
                         for name in EXPORTERS},
            export_deadletter={name: topic(f"{layout.deadletter_stream}.{name}") for name in EXPORTERS},
            meta=glob_escape(layout.key(META)),
            lease=family(LEASE),
            archive=family(ARCHIVE),
            workers=glob_escape(layout.key(WORKERS)),
            spread=family(SPREAD),
            gateway_token=family(GATEWAY_TOKEN),
            everything=glob_escape(layout.key("")) + "*" if layout.namespace else "*",
        )


def _keys(mode: str, *patterns: str) -> tuple[str, ...]:
    return tuple(f"{mode}~{p}" for p in patterns)


def _selector(*rules: str) -> str:
    return "(" + " ".join(rules) + ")"


def plain_exporter(k: KeyPatterns, exporter: str, purpose: str) -> Role:
    """The role of an exporter that keeps no state in Redis (`export postgres`, `export jsonl`): its
    consumer groups on the topics and XADD (only) to its own dead-letter stream, written together with
    the acknowledgement by deadletter_ack.lua (services/streams/reader.py)."""
    return Role(
        exporter_role(exporter),
        f"{purpose}: its consumer groups on the topics and XADD (only) to its own dead-letter stream; a script "
        "writes a dead letter and acknowledges its entry together (each command in it checked as if sent alone)",
        (*CONNECTION, *STREAM_CONSUMER, *_keys("", *k.topics),
         _selector("+xadd", *_keys("%W", *k.export_deadletter[exporter])),
         # EVALSHA names its keys (the dead-letter stream and the topics it acknowledges on): this
         # selector lets the script be called with them; XADD and XACK inside it are checked
         # against the selectors above, so the script can do nothing the user could not.
         _selector("+evalsha", "+eval", "+script|load", "+script|exists",
                   *_keys("", *k.topics, *k.export_deadletter[exporter]))),
    )


def roles(layout: KeyLayout) -> list[Role]:
    k = KeyPatterns.of(layout)
    return [
        Role(
            "tap",
            "`tap`, `publish`: append to the raw shards, nothing else (no control stream, no topic, no reads); "
            "no ACL narrows XADD's MAXLEN/MINID or ids, so it can also empty or block a shard (the workers see it: "
            "services/worker/damage.py)",
            (*CONNECTION, "+xadd", *_keys("%W", k.raw),
             _selector(*META_READ, *_keys("%R", k.meta)), _selector(*META_RECORD, *_keys("", k.meta))),
        ),
        Role(
            "gateway",
            "`gateway`: append to the raw shards (its code always writes `XADD <shard> * ...`; the credential "
            "can send any XADD, as the tap's) and read the gateway tokens (hashes); WAIT for replicas; nothing else",
            (*CONNECTION, "+xadd", "+wait", *_keys("%W", k.raw),
             _selector("+hgetall", *_keys("%R", k.gateway_token)),
             _selector(*META_READ, *_keys("%R", k.meta)), _selector(*META_RECORD, *_keys("", k.meta))),
        ),
        Role(
            "importer",
            "`import-sessions`: a tap that also keeps its import checkpoints and asks the active-run index "
            "whether a run is open (never a run state: it holds unredacted held lines)",
            (*CONNECTION, "+xadd", *_keys("%W", k.raw),
             _selector(*HASH_RW, *SET_RW, *KEY_LIFECYCLE, *_keys("", k.import_checkpoint)),
             _selector("+zscore", *_keys("%R", k.active_runs)),
             _selector(*META_READ, *_keys("%R", k.meta)),
             _selector(*META_RECORD, *_keys("", k.meta))),
        ),
        Role(
            "worker",
            "`worker`, `up`: consume the raw shards, keep run state, commit to topics, control and dead letters",
            (*CONNECTION, *STREAM_CONSUMER, "+xadd", "+xtrim", *HASH_RW, *STRING_RW, *KEY_LIFECYCLE,
             *ZSET_RW, "+zremrangebyscore", *SCRIPTS,
             *_keys("", k.raw, k.control, *k.topics, *k.deadletter, k.run_state, k.active_runs, k.meta, k.lease,
                    k.workers, k.spread)),
        ),
        Role(
            "consumer",
            "`tail`, dashboards, ad-hoc readers: read the (redacted) topics by id (XREAD, XRANGE, XINFO); "
            "no consumer group command, no raw log, no dead letters",
            (*CONNECTION, *STREAM_READER, *_keys("%R", *k.topics)),
        ),
        Role(
            exporter_role("otlp"),
            "`export otlp`: its consumer groups on the topics, its per-run export state and open-run sets, "
            "and XADD (only) to its own dead-letter stream; a script writes a dead letter and acknowledges "
            "its entry together (each command in it checked as if sent alone)",
            (*CONNECTION, *STREAM_CONSUMER, *_keys("", *k.topics),
             _selector(*HASH_RW, *STRING_RW, *ZSET_RW, *KEY_LIFECYCLE, *SCRIPTS, "+setbit", "+getbit", "+rename",
                       *_keys("", *k.export_state["otlp"], *k.export_open["otlp"])),
             _selector("+xadd", *_keys("%W", *k.export_deadletter["otlp"])),
             # the one dead-letter writer (services/streams/deadletter.py): as for `export postgres`
             _selector("+evalsha", "+eval", "+script|load", "+script|exists",
                       *_keys("", *k.topics, *k.export_deadletter["otlp"]))),
        ),
        plain_exporter(k, POSTGRES, "`export postgres` (its state lives in PostgreSQL)"),
        plain_exporter(k, JSONL, "`export jsonl` (its state is its files)"),
        Role(
            "archive",
            "`archive`: its consumer group on the raw shards, control streams and topics (read, acknowledge), "
            "its lease and deployment id, INFO (the server's run_id: a restart); no XADD, no XTRIM, no DEL: "
            "it cannot change what the streams hold (what it can do to other groups: docs/operations.md)",
            (*CONNECTION, *STREAM_CONSUMER, "+info", *_keys("", k.raw, k.control, *k.topics),
             _selector("+get", "+set", "+del", "+pttl", "+pexpire", "+eval", "+evalsha", "+script|load", "+script|exists",
                       *_keys("", k.archive))),
        ),
        Role(
            "admin",
            "operators: `replay`, inspection and repair of groups and keys of this namespace; nothing that "
            "wipes or reconfigures the server",
            ("+@all", "-@dangerous", "+info", "+slowlog|get", "+latency|latest",
             "-script|flush", "-script|kill", "-function|flush", "-function|delete", "-function|restore",
             *CONNECTION, *_keys("", k.everything)),
        ),
    ]


ROLE_NAMES: tuple[str, ...] = tuple(role.name for role in roles(KeyLayout()))


def user_name(role: str, namespace: str = "") -> str:
    """The ACL user of a role: `goose-<role>`, or `<namespace>-<role>` for a namespaced deployment."""
    return f"{namespace}-{role}" if namespace else f"goose-{role}"


def password_hash(password: str) -> str:
    return hashlib.sha256(password.encode("utf-8")).hexdigest()


def render(layout: KeyLayout, passwords: Mapping[str, str] | None = None) -> str:
    """The users.acl text. A role with a password is `on` (stored as its SHA-256); without, `off`."""
    passwords = passwords or {}
    ns = layout.namespace
    # An ACL file has no comments: the roles are explained in docs/architecture.md and deploy/redis/README.md.
    lines = ["user default reset"]  # off, no password, no permissions: every client authenticates as its role
    for role in roles(layout):
        pw = passwords.get(role.name)
        auth = f"on #{password_hash(pw)}" if pw else "off"
        lines.append(f"user {user_name(role.name, ns)} reset {auth} " + " ".join(role.rules))
    return "\n".join(lines) + "\n"


# --- `goose-ingest acl` --------------------------------------------------------------------------
def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "acl",
        help="print the Redis ACL users (one per role) for the configured namespace and names",
        description="Print a users.acl for Redis (aclfile) with one user per role -- " + ", ".join(ROLE_NAMES) + " -- "
        "each limited to the commands and keys it needs (docs/architecture.md). "
        "Roles given a password are on; the others are off.",
    )
    p.add_argument("--password-file", action="append", default=[], metavar="ROLE=PATH",
                   help="read ROLE's password from the first line of PATH (repeatable)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from services.settings import ConfigError, Settings

    passwords: dict[str, str] = {}
    for item in args.password_file:
        role, sep, path = item.partition("=")
        if not sep or role not in ROLE_NAMES:
            raise ConfigError(f"--password-file {item!r}: expected ROLE=PATH with ROLE one of {', '.join(ROLE_NAMES)}")
        try:
            text = Path(path).read_text("utf-8").splitlines()
        except OSError as exc:
            raise ConfigError(f"--password-file {role}: cannot read {path}: {exc.strerror or exc}") from None
        if not text or not text[0]:
            raise ConfigError(f"--password-file {role}: {path} has no password on its first line")
        passwords[role] = text[0]
    sys.stdout.write(render(Settings().layout, passwords))
    return 0
