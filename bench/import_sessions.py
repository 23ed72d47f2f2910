"""`import-sessions` throughput against a floor measured in the same run.

Generates a schema-17 sessions.db (default 500 sessions x 200 messages = 100,000 messages, shapes
like goose's: prompt, assistant text, tool-request rows with thinking, tool-response rows,
``metadata_json.usage`` on the turn's last assistant row, one ledger row per turn, a few subagent
sessions), then measures

- floor: ``read_messages`` over every session (rows -> SourceMessage with its stream-json line);
- subject: the whole import (read, checkpoint, Publisher spool + pipelined XADD, flush,
  checkpoint write) into a Redis: ``REDIS_URL`` or an embedded ``start_redis()``.

    python bench/import_sessions.py [--sessions 500] [--messages 200] [--odd-every K]

``--odd-every K`` spoils every K-th session (a +Inf ``created_timestamp`` on one message, a TEXT
``usage_ledger.cost``): the import must still publish every message, plus one evidence line per odd
value (docs/backfill.md, "Odd values").
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.fixtures import FIXTURES  # noqa: E402  (GOOSE_INGEST_SHARED, as the tests find them)

FIXTURE_SQL = FIXTURES / "a-read-edit-test-finish.sessions-db.sql"
EPOCH = 1_790_000_000  # 2026-09-21


def create_schema(path: Path) -> sqlite3.Connection:
    """An empty schema-17 sessions.db (the fixture's DDL, its rows removed)."""
    conn = sqlite3.connect(path)
    conn.executescript(FIXTURE_SQL.read_text("utf-8"))
    conn.executescript("DELETE FROM messages; DELETE FROM usage_ledger; DELETE FROM sessions;")
    conn.commit()
    return conn


def _ts_text(t: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t))


def add_session(conn: sqlite3.Connection, sid: str, created: int, n_messages: int, rng: random.Random,
                parent: str | None = None, updated: int | None = None) -> int:
    """Insert one session with exactly n_messages rows (ordered in time); returns its last created."""
    rows = []
    ledger = []
    t = created
    rows.append((f"msg_{uuid.UUID(int=rng.getrandbits(128))}", "user",
                 [{"type": "text", "text": f"Task {sid}: fix the failing tests in module {rng.randint(1, 99)}."}], t,
                 {"userVisible": True, "agentVisible": True}))
    turn = 0
    while len(rows) < n_messages:
        t += rng.randint(1, 4)
        turn += 1
        left = n_messages - len(rows)
        if left >= 3 and rng.random() < 0.7:
            call = f"toolu_{uuid.UUID(int=rng.getrandbits(128)).hex[:24]}"
            if rng.random() < 0.5:
                name, args = "shell", {"command": rng.choice(["pytest -q", "ls -la src", "git status",
                                                               f"cat src/mod{turn}.py"])}
            else:
                name, args = "write", {"path": f"src/mod{turn}.py", "content": "x = 1\n" * rng.randint(1, 40)}
            rows.append((f"msg_{uuid.UUID(int=rng.getrandbits(128))}", "assistant",
                         [{"type": "thinking", "thinking": "I should check this. " * rng.randint(1, 10),
                           "signature": "sig" + "A" * 40},
                          {"type": "toolRequest", "id": call,
                           "toolCall": {"status": "success", "value": {"name": name, "arguments": args}}}],
                         t, {"userVisible": True, "agentVisible": True}))
            t += rng.randint(0, 2)
            rows.append((f"msg_{uuid.UUID(int=rng.getrandbits(128))}", "user",
                         [{"type": "toolResponse", "id": call, "toolResult": {"status": "success", "value": {
                             "content": [{"type": "text", "text": "ok\n" * rng.randint(1, 60)}],
                             "isError": False}}}],
                         t, {"userVisible": True, "agentVisible": True}))
        usage = {"inputTokens": rng.randint(1000, 9000), "outputTokens": rng.randint(20, 600)}
        usage["totalTokens"] = usage["inputTokens"] + usage["outputTokens"]
        rows.append((f"msg_01{uuid.UUID(int=rng.getrandbits(128)).hex[:22]}", "assistant",
                     [{"type": "text", "text": "Progress note. " * rng.randint(1, 30)}], t,
                     {"userVisible": True, "agentVisible": True, "usage": usage}))
        ledger.append((sid, t, "claude-sonnet-4-5", usage["inputTokens"], usage["outputTokens"],
                       usage["totalTokens"], 0, 0, round(usage["totalTokens"] * 2e-6, 6), "estimated", 0))
    rows = rows[:n_messages]
    conn.execute(
        "INSERT INTO sessions (id, name, session_type, working_dir, created_at, updated_at, provider_name,"
        " model_config_json, parent_session_id) VALUES (?,?,?,?,?,?,?,?,?)",
        (sid, f"session {sid}", "sub_agent" if parent else "user", "/home/dev/proj", _ts_text(created),
         _ts_text(updated if updated is not None else t), "anthropic",
         json.dumps({"model_name": "claude-sonnet-4-5"}), parent),
    )
    conn.executemany(
        "INSERT INTO messages (message_id, session_id, role, content_json, created_timestamp, metadata_json)"
        " VALUES (?,?,?,?,?,?)",
        [(mid, sid, role, json.dumps(content), c, json.dumps(meta)) for mid, role, content, c, meta in rows],
    )
    conn.executemany(
        "INSERT INTO usage_ledger (session_id, created_timestamp, model, input_tokens, output_tokens,"
        " total_tokens, cache_read_tokens, cache_write_tokens, cost, cost_source, is_compaction)"
        " VALUES (?,?,?,?,?,?,?,?,?,?,?)",
        ledger,
    )
    return t


def generate_db(path: Path, sessions: int, messages: int, seed: int = 1, subagent_every: int = 10) -> list[str]:
    """A sessions.db with `sessions` x `messages` rows; every `subagent_every`-th session is a subagent
    of the one before it. Returns the session ids (in creation order)."""
    rng = random.Random(seed)
    conn = create_schema(path)
    ids = []
    for i in range(sessions):
        day = time.strftime("%Y%m%d", time.gmtime(EPOCH + i * 600))
        sid = f"{day}_{i + 1}"
        parent = ids[-1] if subagent_every and i % subagent_every == subagent_every - 1 and ids else None
        add_session(conn, sid, EPOCH + i * 600, messages, rng, parent=parent)
        ids.append(sid)
    conn.commit()
    conn.close()
    return ids


def spoil(path: Path, sids: list[str]) -> int:
    """Two odd values in each of these sessions; returns how many evidence lines they make."""
    conn = sqlite3.connect(path)
    for sid in sids:
        conn.execute("UPDATE messages SET created_timestamp = ? WHERE id = (SELECT MIN(id) FROM messages"
                     " WHERE session_id = ?)", (float("inf"), sid))
        conn.execute("UPDATE usage_ledger SET cost = 'n/a' WHERE id = (SELECT MIN(id) FROM usage_ledger"
                     " WHERE session_id = ?)", (sid,))
    conn.commit()
    conn.close()
    return 2 * len(sids)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=500)
    ap.add_argument("--messages", type=int, default=200)
    ap.add_argument("--odd-every", type=int, default=0, metavar="K", help="spoil every K-th session (0: none)")
    args = ap.parse_args()

    from services.backfill.importer import Importer
    from services.backfill.sessions_db import list_sessions, open_readonly, read_messages
    from services.broker.connect import sync_client_with_timeouts
    from services.broker.embedded import start_redis
    from services.settings import Settings

    with tempfile.TemporaryDirectory(prefix="bench-import-") as tmp:
        db = Path(tmp) / "sessions.db"
        t0 = time.perf_counter()
        sids = generate_db(db, args.sessions, args.messages)
        total = args.sessions * args.messages
        odd = spoil(db, sids[:: args.odd_every]) if args.odd_every else 0
        print(f"generated {db.stat().st_size / 1e6:.1f} MB, {args.sessions} sessions x {args.messages} messages "
              f"= {total} in {time.perf_counter() - t0:.1f}s")

        server = None
        url = os.environ.get("REDIS_URL")
        if not url:
            server = start_redis(dir=str(Path(tmp) / "redis"))
            url = server.url
        ns = f"bench{uuid.uuid4().hex[:8]}"
        settings = Settings(redis_url=url, namespace=ns, spool_dir=str(Path(tmp) / "spool"))
        client = sync_client_with_timeouts(settings, socket_timeout=30.0, connect_timeout=5.0)
        try:
            # floor: reading every session's rows
            conn = open_readonly(db)
            t0 = time.perf_counter()
            n = sum(len(read_messages(conn, s.id)) for s in list_sessions(conn))
            floor_s = time.perf_counter() - t0
            assert n == total, n
            conn.close()

            conn = open_readonly(db)
            t0 = time.perf_counter()
            imp = Importer(settings, conn, "bench", client, final_after_s=600.0)
            published = 0
            for s in list_sessions(conn):
                published += imp.import_session(s).new
            import_s = time.perf_counter() - t0
            conn.close()
            assert published == total, published
            raw = sum(client.xlen(k) for k in settings.layout.raw_streams())
            assert raw == total + 2 * args.sessions + odd, raw  # + complete + eof per session, + evidence

            floor_rate = total / floor_s
            rate = total / import_s
            print(f"floor  read_messages over all sessions: {floor_rate:>10,.0f} messages/s ({floor_s:.2f}s)")
            print(f"import-sessions (publish to Redis):     {rate:>10,.0f} messages/s ({import_s:.2f}s, "
                  f"{raw} raw entries)")
            print(f"ratio import / floor: {rate / floor_rate:.3f}")
        finally:
            for key in client.scan_iter(match=f"{ns}:*", count=1000):
                client.unlink(key)
            client.close()
            if server is not None:
                server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
