"""`goose-ingest import-sessions`: publish goose's sessions.db as runs (docs/backfill.md)."""

from __future__ import annotations

import argparse
import sqlite3
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from services.backfill.importer import (
    DEFAULT_FINAL_AFTER_S,
    DeliveryRefused,
    FileCheckpoints,
    Importer,
    ImportError_,
    parse_since,
    validate_namespace,
)
from services.backfill.sessions_db import SessionsDbError, list_sessions, open_readonly
from services.broker.url import redact_url
from services.settings import Settings
from services.tap.console import PROG as CLI
from services.tap.spool import SpoolCorrupt, SpoolLocked

if TYPE_CHECKING:  # imported where used: only an interactive import draws a bar
    from tqdm import tqdm

PROG = "goose-ingest import-sessions"
EXIT_SKIPPED = 3  # every other session imported; some were skipped (each named on stderr)
ODD_SHOWN = 3  # odd values listed on a session's warning line; the rest are counted


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "import-sessions",
        help="publish the sessions of a goose sessions.db as runs (incremental, idempotent)",
        description="Read goose's sessions.db (read-only) and publish every session as the run NS/<session id> "
        "through the normal pipeline. Re-running publishes only messages never published before; the "
        "checkpoint lives in the broker (through a gateway: in --state-file). See docs/backfill.md.",
    )
    p.add_argument("path", help="the sessions.db file")
    p.add_argument("--namespace", required=True, metavar="NS",
                   help="installation/profile namespace: run keys are NS/<session id> (A-Z a-z 0-9 . _ : @ -)")
    p.add_argument("--since", metavar="DATE", help="only sessions created at or after DATE (ISO 8601; naive = UTC)")
    p.add_argument("--session", metavar="ID", help="only this session")
    p.add_argument("--dry-run", action="store_true", help="print what would be published; publish nothing")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--final-after", type=float, default=DEFAULT_FINAL_AFTER_S, metavar="SECONDS",
                   help="a session idle this long gets its complete + eof (the run ends); a more recent one "
                   f"stays open for later messages (default {DEFAULT_FINAL_AFTER_S:.0f}; keep it below "
                   "GOOSE_INGEST_RUN_IDLE_TIMEOUT_S)")
    p.add_argument("--state-file", metavar="PATH",
                   help="through a gateway (GOOSE_INGEST_ENDPOINT, no broker): the file that keeps the checkpoints "
                   "(default <GOOSE_INGEST_SPOOL_DIR>/import-sessions/<NS>.jsonl); unused in direct mode")
    p.add_argument("--now", metavar="TIME", help=argparse.SUPPRESS)  # reproducible idle rule (tests)
    p.set_defaults(func=run)


def _fail(msg: str, code: int = 2) -> int:
    print(f"{PROG}: error: {msg}", file=sys.stderr, flush=True)
    return code


def _progress(total: int, enabled: bool) -> tqdm | None:
    if not enabled or not sys.stderr.isatty():
        return None
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency
        return None
    return tqdm(total=total, unit="msg", unit_scale=True, file=sys.stderr, desc="import-sessions", leave=False)


def _probe_gateway(settings: Settings, ns: str) -> str:
    """An empty batch to the gateway, then the token's prefix: '' when the gateway takes the token and
    the prefix covers the run keys ``NS/<session id>``, else why not (one line, exit 2).

    Like the broker's PING and role check in direct mode: a wrong or revoked token, a gateway out of
    reach, or a prefix that would get every batch a 403 is said at once instead of every session's
    entries waiting in the spool for a retry that cannot succeed."""
    from services.tap.http_transport import GatewayError, HttpTransport

    transport = HttpTransport(settings)  # a malformed endpoint or token: ConfigError, one line (services/cli.py)
    try:
        transport.send([])
        prefix = str(transport.token_info()["prefix"])
    except GatewayError as exc:
        return f"{redact_url(transport.url)}: {exc}"
    finally:
        transport.close()
    if not f"{ns}/".startswith(prefix):
        return (f"the gateway refused the run keys: the token's prefix {prefix!r} does not cover {ns}/<session id> "
                f"(every batch would get 403); use a token made with `{CLI} tokens create --prefix {ns}/`, or "
                f"--namespace inside the prefix")
    return ""


def run(args: argparse.Namespace) -> int:
    try:
        ns = validate_namespace(args.namespace)
        since = parse_since(args.since) if args.since else None
        now_s = parse_since(args.now).timestamp() if args.now else None
    except ImportError_ as exc:
        return _fail(str(exc))
    if args.final_after < 0:
        return _fail("--final-after must be >= 0")
    settings = Settings()
    try:
        conn = open_readonly(args.path)
    except SessionsDbError as exc:
        return _fail(str(exc))
    client = None
    checkpoints: FileCheckpoints | None = None
    # redis-py only in broker mode: through a gateway this runs in the tap-only install (packaging/tap)
    no_permission: tuple[type[Exception], ...] = ()
    broker_error: tuple[type[Exception], ...] = ()
    try:
        if settings.redis_url:
            import redis

            from services.broker.cluster import ensure_shard_count
            from services.broker.connect import sync_client_with_timeouts

            no_permission, broker_error = (redis.exceptions.NoPermissionError,), (redis.RedisError,)
            client = sync_client_with_timeouts(settings, socket_timeout=30.0, connect_timeout=5.0)
            try:
                client.ping()
                # another shard count than the data's would put runs and checkpoints in other
                # shards (ShardCountMismatch: one line, exit 2, from services/cli.py)
                ensure_shard_count(client, settings.layout)
            except (redis.AuthenticationError, redis.exceptions.NoPermissionError):
                raise  # credentials or role: services/cli.py reports it as one line, exit 2
            except (redis.RedisError, OSError) as exc:
                return _fail(f"broker unreachable at {redact_url(settings.redis_url)}: {exc}")
        elif settings.endpoint:
            # through an ingest gateway: the host has no broker, so the checkpoints are a file it owns
            state = (Path(args.state_file).expanduser() if args.state_file else
                     Path(settings.spool_dir).expanduser() / "import-sessions" / f"{ns}.jsonl")
            if not args.dry_run:
                refused = _probe_gateway(settings, ns)
                if refused:
                    return _fail(refused)
            try:
                checkpoints = FileCheckpoints(state)
            except ImportError_ as exc:
                return _fail(str(exc))
        elif not args.dry_run:
            return _fail("no broker configured: set GOOSE_INGEST_REDIS_URL, or GOOSE_INGEST_ENDPOINT and a token "
                         "(or use --dry-run)")
        if args.final_after >= settings.run_idle_timeout_s:
            print(f"{PROG}: warning: --final-after {args.final_after:g}s >= the worker's run idle timeout "
                  f"{settings.run_idle_timeout_s:g}s: open runs will be abandoned and continued as new parts",
                  file=sys.stderr)
        try:
            sessions = list_sessions(conn, since=since, session_id=args.session)
        except Exception as exc:  # sqlite3.Error: a damaged sessions table
            return _fail(f"cannot read {args.path}: {exc}")
        try:  # only for the progress bar: a damaged messages table is each session's to report
            counts = dict(conn.execute("SELECT session_id, COUNT(*) FROM messages GROUP BY session_id").fetchall())
        except sqlite3.DatabaseError:
            counts = {}
        if args.session and not sessions:
            return _fail(f"no session {args.session!r} in {args.path}")
        importer = Importer(settings, conn, ns, client, final_after_s=args.final_after, now_s=now_s,
                            dry_run=args.dry_run, checkpoints=checkpoints)
        if args.dry_run and client is None and checkpoints is None:
            print("no broker configured: nothing is known to be published yet, every message counts as new")
        bar = _progress(sum(counts.get(s.id, 0) for s in sessions), not args.no_progress)
        totals = {"sessions": 0, "published": 0, "ended": 0, "skipped": 0, "odd": 0}
        why: dict[str, int] = {}  # skip reasons by column
        try:
            for s in sessions:
                res = importer.import_session(s)
                totals["sessions"] += 1
                totals["published"] += res.new
                totals["ended"] += int(res.eof)
                if res.skipped:
                    totals["skipped"] += 1
                    column = res.skipped.split(" ", 1)[0].rstrip(":")
                    why[column] = why.get(column, 0) + 1
                    print(f"{PROG}: warning: session {s.id!r} skipped: {res.skipped}", file=sys.stderr)
                if res.odd:
                    totals["odd"] += len(res.odd)
                    shown = "; ".join(o.brief() for o in res.odd[:ODD_SHOWN])
                    more = f"; and {len(res.odd) - ODD_SHOWN} more" if len(res.odd) > ODD_SHOWN else ""
                    print(f"{PROG}: warning: session {s.id!r}: {len(res.odd)} odd value(s) kept as native "
                          f"evidence: {shown}{more}", file=sys.stderr)
                if args.dry_run:
                    eof = "yes" if res.eof else "no"
                    extra = f"  ({res.note})" if res.note else ""
                    print(f"{res.run or s.id}\t{res.new} new message(s)\teof: {eof}{extra}")
                if bar is not None:
                    bar.update(counts.get(s.id, 0))
        except (SpoolLocked, SpoolCorrupt) as exc:
            return _fail(str(exc), 1)
        except DeliveryRefused as exc:  # a token revoked mid-import: one line, as at the start
            return _fail(f"{redact_url(settings.endpoint or '')}: {exc}")
        except no_permission:
            raise  # the wrong role: one line naming it, exit 2 (services/cli.py)
        except broker_error as exc:
            return _fail(f"broker error: {exc}", 1)
        finally:
            if bar is not None:
                bar.close()
        verb = "would publish" if args.dry_run else "published"
        skipped = f"{totals['skipped']} skipped"
        if why:
            skipped += " (" + ", ".join(f"{n} {col}" for col, n in sorted(why.items())) + ")"
        print(f"{PROG}: {totals['sessions']} session(s): {totals['sessions'] - totals['skipped']} imported, "
              f"{skipped}; {verb} {totals['published']} message(s), {totals['ended']} run(s) ended, "
              f"{totals['odd']} odd value(s) kept as native evidence", file=sys.stderr)
        return EXIT_SKIPPED if totals["skipped"] else 0
    finally:
        conn.close()
        if client is not None:
            client.close()
        if checkpoints is not None:
            checkpoints.close()
