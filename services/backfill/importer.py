"""Import goose's sessions.db into the pipeline: each session becomes a run published through the
normal Publisher (raw shard streams), incrementally and idempotently (docs/backfill.md).

Per session ``S`` of namespace ``NS``:

- run key ``NS/S`` (part 1); a continuation part ``k >= 2`` is the run ``NS/S/k``;
- one raw ``line`` entry per message (``created_timestamp, id`` order) holding the stream-json
  ``message`` line, ``ts`` = created seconds x 1000; then, once the session is final (idle for
  ``final_after_s``), a ``complete`` line and an ``eof`` without exit code;
- the checkpoint lives in the broker: hash ``<ns>:goose-ingest:import:NS/S`` (``run``, ``part``,
  ``next_seq``, ``ended``, ``last_ms``, ``reported``) and set ``...:ids`` (message keys published);
  it is written only after the Publisher confirmed delivery of what it covers. Through an ingest
  gateway (``GOOSE_INGEST_ENDPOINT``, no broker credential on the host) the same records go to a
  file the agent host owns instead (``FileCheckpoints``, below; docs/backfill.md).

A session is read and parsed whole (``prepare``) before anything of it is published: a value that
does not parse is either replaced (and published as native evidence, a ``goose-ingest.native``
line that workers keep as an ``unknown`` event) or makes the session skipped with one line naming
the column; either way the other sessions go on (docs/backfill.md, "Odd values").
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import sqlite3
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from services.backfill.sessions_db import (
    OddValue,
    SessionInfo,
    SourceMessage,
    UsageRecord,
    UsageReport,
    read_messages,
    usage_report,
)
from services.settings import Settings
from services.tap.publisher import Publisher
from services.tap.runkey import is_valid_run
from services.tap.spool import LOG, Spool, SpoolLocked, spool_path

if TYPE_CHECKING:  # redis-py only in broker mode: through a gateway this runs in the tap-only install
    import redis

NS_RE = re.compile(r"[A-Za-z0-9._:@-]+")
SID_RE = re.compile(r"[A-Za-z0-9._:@-]+")
AGENT = "goose"
DEFAULT_FINAL_AFTER_S = 600.0
# an open run is only continued when our last entry to it is at least this far from the worker's
# idle-abandon horizon (GOOSE_INGEST_RUN_IDLE_TIMEOUT_S)
IDLE_MARGIN_S = 60.0
# An open run not in the worker's active-run index this long after our last delivery was closed
# by the worker (ended or abandoned), not merely not processed yet (see _open_run_state).
LAG_GRACE_S = 300.0
COMPLETE_TAG = "\x00complete"
EVIDENCE_TAG = "\x00native"  # spool resume tag of native-evidence lines: <message key> + it, or it alone
MODEL_LABEL_MAX = 200  # a longer (or unprintable) model name is not put on every raw entry
# test hook: exit abruptly after N sessions were flushed, before their checkpoint is written
CRASH_ENV = "GOOSE_INGEST_IMPORT_TEST_CRASH_AFTER"

SRC_FOR_USAGE = {
    "usage_ledger": "usage_ledger",
    "message_metadata": "messages",
    "session_accumulated": "sessions",
    "none": "none",
}
_COUNTERS = ("total_tokens", "input_tokens", "output_tokens", "cache_read_input_tokens", "cache_write_input_tokens")


class ImportError_(Exception):
    """A usage error detected by the importer (exit 2)."""


def validate_namespace(ns: str) -> str:
    if not isinstance(ns, str) or not NS_RE.fullmatch(ns):
        raise ImportError_(
            f"invalid --namespace {ns!r}: must be 1 or more of A-Z a-z 0-9 . _ : @ - (no '/')"
        )
    return ns


def checkpoint_key(settings: Settings, base: str) -> str:
    return settings.layout.import_checkpoint(base)


def ids_key(settings: Settings, base: str) -> str:
    return checkpoint_key(settings, base) + ":ids"  # same hash tag as its checkpoint (one slot)


def run_key(base: str, part: int) -> str:
    return base if part <= 1 else f"{base}/{part}"


def message_keys(messages: Iterable[SourceMessage]) -> list[str]:
    """Dedup keys: the message_id; a later row with the same message_id gets ``<id>\\x00<n>``."""
    seen: dict[str, int] = {}
    out = []
    for m in messages:
        n = seen.get(m.message_id, 0)
        seen[m.message_id] = n + 1
        out.append(m.message_id if n == 0 else f"{m.message_id}\x00{n}")
    return out


def usage_delta(now: UsageRecord, before: UsageRecord | None) -> UsageRecord:
    """The ``complete`` record for what ``now`` adds to ``before`` (totals already reported)."""
    if not before:
        return dict(now)
    out: dict[str, Any] = {"type": "complete"}
    for key in _COUNTERS:
        v = now.get(key)
        if v is None:
            if key == "total_tokens":
                out[key] = None
            continue
        out[key] = max(0, v - int(before.get(key) or 0))
    if now.get("cost_usd") is not None:
        out["cost_usd"] = round(max(0.0, now["cost_usd"] - float(before.get("cost_usd") or 0.0)), 10)
    return out


def _now_ms_of(client: redis.Redis | None) -> int:
    if client is not None:
        import redis  # a client: the broker mode, the full install

        try:
            s, us = client.time()
            return int(s) * 1000 + int(us) // 1000
        except redis.RedisError:
            pass
    return time.time_ns() // 1_000_000


# --- checkpoint ---------------------------------------------------------------------------------


@dataclass
class Checkpoint:
    run: str | None = None
    part: int = 0
    next_seq: int = 0
    ended: bool = False
    last_ms: int = 0
    reported: UsageRecord = field(default_factory=dict)
    ids: set[str] = field(default_factory=set)
    worker_state: str | None = None  # the worker has `run`: running / closed (ended or abandoned) / None: unknown


def load_checkpoint(client: redis.Redis, settings: Settings, base: str) -> Checkpoint:
    pipe = client.pipeline(transaction=False)
    pipe.hgetall(checkpoint_key(settings, base))
    pipe.smembers(ids_key(settings, base))
    h, ids = pipe.execute()
    h = {k.decode(): v.decode() for k, v in h.items()}
    cp = Checkpoint()
    if h:
        cp.run = h.get("run") or None
        cp.part = int(h.get("part", "0"))
        cp.next_seq = int(h.get("next_seq", "0"))
        cp.ended = h.get("ended") == "1"
        cp.last_ms = int(h.get("last_ms", "0"))
        cp.reported = json.loads(h.get("reported") or "{}")
    cp.ids = {i.decode("utf-8", "surrogateescape") for i in ids}
    if cp.run and not cp.ended:
        cp.worker_state = _open_run_state(client, settings, cp)
    return cp


def _open_run_state(client: redis.Redis, settings: Settings, cp: Checkpoint) -> str | None:
    """Whether the worker still has the checkpoint's open run, from its active-run index only.

    Not from the run state: that holds held raw lines (secrets before redaction), and the importer's
    role may not read it (issue 21). An open run is in the index from the worker's first commit of it
    until it ends or is abandoned; absent, it is either closed or not processed yet (a backlog).
    Absent for longer than LAG_GRACE_S after our last delivery counts as closed: at worst a lagging
    worker makes the session continue as a new part, never an append to a closed run."""
    layout = settings.layout
    if client.zscore(layout.active_runs(layout.shard_of(cp.run or "")), cp.run or "") is not None:
        return "running"
    if cp.last_ms and _now_ms_of(client) - cp.last_ms > LAG_GRACE_S * 1000:
        return "closed"
    return None


def save_checkpoint(client: redis.Redis, settings: Settings, base: str, cp: Checkpoint, new_ids: list[str],
                    session: SessionInfo) -> None:
    pipe = client.pipeline(transaction=True)
    key = checkpoint_key(settings, base)
    for i in range(0, len(new_ids), 1000):
        pipe.sadd(ids_key(settings, base), *new_ids[i:i + 1000])
    pipe.hset(key, mapping={
        "run": cp.run or "",
        "part": str(cp.part),
        "next_seq": str(cp.next_seq),
        "ended": "1" if cp.ended else "0",
        "last_ms": str(cp.last_ms),
        "reported": json.dumps(cp.reported, separators=(",", ":")),
        "session": session.id,
        "parent": session.parent_session_id or "",
    })
    pipe.execute()


def _copy(cp: Checkpoint) -> Checkpoint:
    return Checkpoint(cp.run, cp.part, cp.next_seq, cp.ended, cp.last_ms, dict(cp.reported), set(cp.ids))


class CheckpointStore(Protocol):
    def load(self, base: str) -> Checkpoint: ...

    def save(self, base: str, cp: Checkpoint, new_ids: list[str], session: SessionInfo) -> None: ...


@dataclass
class RedisCheckpoints:
    """Checkpoints in the broker (direct mode): what the importer role may read and write."""

    client: redis.Redis
    settings: Settings

    def load(self, base: str) -> Checkpoint:
        return load_checkpoint(self.client, self.settings, base)

    def save(self, base: str, cp: Checkpoint, new_ids: list[str], session: SessionInfo) -> None:
        save_checkpoint(self.client, self.settings, base, cp, new_ids, session)


class DeliveryRefused(ImportError_):
    """The gateway refused the token, the run key or the endpoint mid-import (401/403/404): no outage to
    wait out; the run's entries stay spooled and no checkpoint covers them."""


def deliver(pub: Publisher) -> None:
    """Wait until everything spooled for the run is confirmed, as long as the broker or gateway is out of
    service (that is what the spool is for); a gateway's refusal is no outage: ``DeliveryRefused``."""
    while not pub.flush(0.5):
        if pub.refusal is not None:
            raise DeliveryRefused(f"{pub.refusal}; {pub.pending} entries of run {pub.run} stay spooled in "
                                  f"{pub.spool_dir} (a later import delivers them)")
        if not pub.sender_alive:
            return  # it failed (logged); as flush() without a timeout returned


class CheckpointFileError(ImportError_):
    """The state file cannot be used (locked by another import, unreadable, damaged)."""


class FileCheckpoints:
    """Checkpoints in a file the agent host owns: an import through a gateway has no broker to keep them.

    An append-only log of JSON lines, one per saved checkpoint (its fields and the message keys it
    newly covers), fsync'ed before ``save`` returns; opening replays it (the latest fields win, the
    keys add up). Appending costs what one session adds, never a rewrite of the whole state; a crash
    mid-append leaves a torn last line, which replay ignores: that checkpoint was not recorded, and
    the run's spool delivers what it covered (as when the broker's checkpoint write is lost).

    The worker's active-run index is out of reach too: an open run counts as "not known closed"
    (``worker_state`` None), so it is continued only within the idle horizon of this host's
    GOOSE_INGEST_RUN_IDLE_TIMEOUT_S (set it to the cluster's). One import at a time per file (flock)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        except OSError as exc:
            raise CheckpointFileError(f"cannot open the import state file {path}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._fd)
            raise CheckpointFileError(f"{path} is in use by another import-sessions") from None
        self._state: dict[str, Checkpoint] = {}
        with open(self._fd, "rb", closefd=False) as f:
            data = f.read()
        complete = data.rfind(b"\n") + 1
        if complete < len(data):  # a torn last line (no newline): that save never completed; cut it off
            os.ftruncate(self._fd, complete)
        for number, line in enumerate(data[:complete].split(b"\n")[:-1], 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                cp = self._state.setdefault(rec["base"], Checkpoint())
                cp.run, cp.part, cp.next_seq = rec["run"] or None, int(rec["part"]), int(rec["next_seq"])
                cp.ended, cp.last_ms, cp.reported = bool(rec["ended"]), int(rec["last_ms"]), dict(rec["reported"])
                cp.ids.update(rec["ids"])
            except (ValueError, KeyError, TypeError):
                os.close(self._fd)
                raise CheckpointFileError(f"{path}: line {number} is damaged (not a checkpoint record)") from None

    def load(self, base: str) -> Checkpoint:
        cp = self._state.get(base)
        return Checkpoint() if cp is None else _copy(cp)

    def save(self, base: str, cp: Checkpoint, new_ids: list[str], session: SessionInfo) -> None:
        rec = {"base": base, "run": cp.run or "", "part": cp.part, "next_seq": cp.next_seq, "ended": cp.ended,
               "last_ms": cp.last_ms, "reported": cp.reported, "session": session.id,
               "parent": session.parent_session_id or "", "ids": new_ids}
        data = json.dumps(rec, separators=(",", ":"), ensure_ascii=True).encode() + b"\n"
        os.write(self._fd, data)
        os.fsync(self._fd)
        self._state[base] = _copy(cp)

    def close(self) -> None:
        os.close(self._fd)


# --- plan ---------------------------------------------------------------------------------------


@dataclass
class SessionResult:
    session: str
    run: str | None
    new: int  # messages published (or that would be)
    eof: bool  # eof published (or would be)
    note: str = ""
    continuation: bool = False
    skipped: str = ""  # why the session was skipped (nothing of it published): "<column>: <reason>"
    odd: tuple[OddValue, ...] = ()  # values that did not parse, published as native evidence


@dataclass(frozen=True)
class Prepared:
    """A session read and parsed whole, before anything of it is published."""

    messages: list[SourceMessage]
    keys: list[str]
    final: bool
    last_ms: int
    usage: UsageReport
    parent: str | None  # the parent's run key
    model: str | None
    odd: tuple[OddValue, ...]  # the session row's and the usage's odd values (the messages' ride along)


@dataclass
class Importer:
    settings: Settings
    conn: sqlite3.Connection
    namespace: str
    client: redis.Redis | None  # None: no broker (dry-run only)
    final_after_s: float = DEFAULT_FINAL_AFTER_S
    now_s: float | None = None  # "now" for the idle rule (default: the broker's clock)
    dry_run: bool = False
    # where checkpoints live: the broker's (default, from ``client``) or a FileCheckpoints (gateway mode)
    checkpoints: CheckpointStore | None = None
    _crash_after: int | None = None
    _flushed_sessions: int = 0
    _now_s: float = field(init=False, default=0.0)  # now_s, or the broker's clock when it was None

    def __post_init__(self) -> None:
        validate_namespace(self.namespace)
        env = os.environ.get(CRASH_ENV)
        self._crash_after = int(env) if env else None
        self._now_s = self.now_s if self.now_s is not None else _now_ms_of(self.client) / 1000
        if self.checkpoints is None and self.client is not None:
            self.checkpoints = RedisCheckpoints(self.client, self.settings)

    # ---------------------------------------------------------------- helpers
    def base(self, session_id: str) -> str:
        return f"{self.namespace}/{session_id}"

    def labels(self, prep: Prepared, continues: str | None) -> dict[str, str]:
        labels = {"host": self.namespace, "agent": AGENT}
        if prep.parent:
            labels["parent"] = prep.parent
        if continues:
            labels["continues"] = continues
        if prep.model:
            labels["model"] = prep.model
        return labels

    def _final(self, session: SessionInfo, messages: list[SourceMessage]) -> tuple[bool, int]:
        """(final?, last activity in ms): final when idle for at least final_after_s."""
        times = [m.created for m in messages]
        upd = session.updated_at
        if upd is not None:
            times.append(int(upd.timestamp()))
        if not times and session.created_at is not None:
            times.append(int(session.created_at.timestamp()))
        last = max(times) if times else 0
        return (self._now_s - last) >= self.final_after_s, last * 1000

    def _open_run_usable(self, run: str, cp: Checkpoint) -> tuple[bool, str]:
        """Can entries still be appended to the checkpoint's open run `run` (no eof sent)?"""
        if cp.worker_state == "closed":
            return False, f"the worker closed {run} (it left the active-run index)"
        idle_s = (_now_ms_of(self.client) - cp.last_ms) / 1000
        horizon = self.settings.run_idle_timeout_s - min(IDLE_MARGIN_S, self.settings.run_idle_timeout_s / 4)
        if idle_s >= horizon:
            return False, f"{run} was idle {idle_s:.0f}s, the worker abandons runs after {self.settings.run_idle_timeout_s:.0f}s"
        if not (spool_path(self.settings, run) / LOG).exists():
            return False, f"the spool of {run} (its seq counter) is gone"
        return True, ""

    def _drop_spool(self, run: str) -> None:
        path = spool_path(self.settings, run)
        if not path.exists():
            return
        try:
            Spool(path).close(remove=True)
        except (SpoolLocked, OSError):
            pass

    def _run_base_ok(self, sid: str) -> bool:
        return SID_RE.fullmatch(sid) is not None and is_valid_run(self.base(sid) + "/99999")

    def prepare(self, session: SessionInfo) -> Prepared | str:
        """Reads and parses the whole session; a string says why it is skipped (naming the column)."""
        sid = session.id
        if session.id_problem:
            return f"{session.id_problem}: no run key can be formed"
        if not self._run_base_ok(sid):
            return f"sessions.id {sid!r} cannot form a run key ([A-Za-z0-9._:@-], at most 200 with the namespace)"
        odd = list(session.odd)
        parent = None
        if session.parent_session_id is not None:
            if self._run_base_ok(session.parent_session_id):
                parent = self.base(session.parent_session_id)
            else:
                odd.append(OddValue(sid, "sessions", None, "parent_session_id", session.parent_session_id,
                                    "cannot form a run key: the parent link is dropped"))
        model = session.model
        if model is not None and not (len(model) <= MODEL_LABEL_MAX and model.isprintable() and _utf8(model)):
            odd.append(OddValue(sid, "sessions", None, "model", model,
                                f"not a printable name of at most {MODEL_LABEL_MAX} characters: no model label"))
            model = None
        try:
            messages = read_messages(self.conn, sid)
            usage = usage_report(self.conn, sid)
        except sqlite3.DatabaseError as exc:  # a damaged page under this session's rows
            return f"messages/usage_ledger unreadable: {exc}"
        final, last_ms = self._final(session, messages)
        return Prepared(messages, message_keys(messages), final, last_ms, usage, parent, model,
                        tuple(odd) + usage.odd)

    # ---------------------------------------------------------------- one session
    def import_session(self, session: SessionInfo) -> SessionResult:
        sid = session.id
        prep = self.prepare(session)
        if isinstance(prep, str):
            return SessionResult(sid, None, 0, False, note=f"skipped: {prep}", skipped=prep)
        return self._import_prepared(session, prep)

    def _import_prepared(self, session: SessionInfo, prep: Prepared) -> SessionResult:
        sid = session.id
        base = self.base(sid)
        messages, keys, final = prep.messages, prep.keys, prep.final
        store = self.checkpoints
        cp = store.load(base) if store is not None else Checkpoint()

        force = ""  # set when the open run turned out not to be continuable
        recovered, recovered_eof = 0, False  # delivered from the spool of an interrupted import
        for _attempt in range(3):
            new = [(m, k) for m, k in zip(messages, keys, strict=True) if k not in cp.ids]
            if cp.run is not None and cp.ended and not new:
                if recovered:
                    return SessionResult(sid, cp.run, recovered, recovered_eof, note="recovered from its spool")
                return SessionResult(sid, cp.run, 0, False, note="up to date, run already ended")
            if cp.run is not None and not cp.ended and not new and not final:
                return SessionResult(sid, cp.run, 0, False, note="up to date, session active: run stays open")
            # the run to publish to
            continuation = False
            note = ""
            ends_open_run: str | None = None  # an open run given up for a new part (its spool is dropped)
            if cp.run is None:
                run, part, seq0, continues = run_key(base, 1), 1, 0, None
            elif cp.ended:
                run, part, seq0, continues = run_key(base, cp.part + 1), cp.part + 1, 0, cp.run
                continuation, note = True, f"continues ended {cp.run}"
            else:
                ok, why = (False, force) if force else (
                    self._open_run_usable(cp.run, cp) if store is not None else (True, ""))
                if ok:
                    run, part, seq0, continues = cp.run, cp.part, cp.next_seq, None
                else:
                    run, part, seq0, continues = run_key(base, cp.part + 1), cp.part + 1, 0, cp.run
                    continuation, note = True, f"continues {cp.run} ({why})"
                    ends_open_run = cp.run
            if self.dry_run:
                if not final:
                    note = "; ".join(x for x in (note, "session active: run stays open") if x)
                return SessionResult(sid, run, len(new), final, note=note, continuation=continuation,
                                     odd=_odd_of(prep, new))
            client = self.client  # None through a gateway: the Publisher sends to GOOSE_INGEST_ENDPOINT
            if store is None:
                raise ImportError_("no broker configured: set GOOSE_INGEST_REDIS_URL (or use --dry-run)")
            if ends_open_run is not None:
                self._drop_spool(ends_open_run)  # that run is over; its unconfirmed entries go to the new part
            labels = self.labels(prep, continues)
            pub = Publisher(self.settings, run, labels, client=client)
            try:
                if pub.next_seq < seq0:  # the spool is behind the checkpoint: cannot continue this run
                    pub.close()
                    force = f"the spool of {run} is behind its checkpoint"
                    continue
                if pub.finished:
                    # a previous import spooled this run's eof and stopped before its checkpoint:
                    # deliver, record and look again
                    covered = [k for k in keys if k not in cp.ids and pub.lines_from(k)]
                    deliver(pub)
                    cp = Checkpoint(run=run, part=part, next_seq=pub.next_seq, ended=True,
                                    last_ms=_now_ms_of(client), reported=cp.reported if cp.run else {},
                                    ids=cp.ids | set(covered))
                    if pub.lines_from(COMPLETE_TAG):
                        cp.reported = prep.usage.record
                    store.save(base, cp, covered, session)
                    pub.close()
                    recovered, recovered_eof = len(covered), True
                    continue
                published = self._publish(pub, session, prep, new, cp.reported)
                deliver(pub)
                self._flushed_sessions += 1
                if self._crash_after is not None and self._flushed_sessions >= self._crash_after:
                    os._exit(99)
                new_keys = [k for _m, k in new]
                cp = Checkpoint(run=run, part=part, next_seq=pub.next_seq, ended=final,
                                last_ms=_now_ms_of(client),
                                reported=published if final else cp.reported, ids=cp.ids | set(new_keys))
                store.save(base, cp, new_keys, session)
            finally:
                pub.close(timeout=0 if pub.refusal is not None else None)  # a refusal: no wait for it again
            return SessionResult(sid, run, len(new) + recovered, final or recovered_eof, note=note,
                                 continuation=continuation, odd=_odd_of(prep, new))
        raise RuntimeError(f"session {sid}: could not settle its run state")

    def _publish(self, pub: Publisher, session: SessionInfo, prep: Prepared, new: list[tuple[SourceMessage, str]],
                 reported: UsageRecord) -> UsageRecord:
        """Spools the new messages (and complete + eof when final); returns the usage totals reported.
        Every odd value goes with what it belongs to: a message's right after that message, the
        session row's and the usage's right before the complete."""
        sid = session.id
        for m, k in new:
            if not pub.lines_from(k):  # else spooled by an interrupted import: the spool delivers it
                pub.add_line(m.line, "stdout", m.created * 1000,
                             {"src.table": "messages", "src.rowid": str(m.rowid), "src.message_id": m.message_id,
                              "src.session_id": sid},
                             source=k)
            if m.odd:
                self._evidence(pub, m.odd, m.created * 1000, k + EVIDENCE_TAG)
        if not prep.final:
            return reported
        last_ms = prep.last_ms
        if prep.odd and not pub.lines_from(COMPLETE_TAG):
            self._evidence(pub, prep.odd, last_ms, EVIDENCE_TAG)
        totals, source = prep.usage.record, prep.usage.source
        if not pub.lines_from(COMPLETE_TAG):
            complete = usage_delta(totals, reported)
            pub.add_line(json.dumps(complete, separators=(",", ":")), "stdout", last_ms,
                         {"src.table": SRC_FOR_USAGE.get(source, source), "src.usage": source,
                          "src.session_id": sid},
                         source=COMPLETE_TAG)
        pub.add_eof(None, last_ms, {"src.table": "sessions", "src.session_id": sid})
        return totals

    @staticmethod
    def _evidence(pub: Publisher, odd: tuple[OddValue, ...], ts_ms: int, tag: str) -> None:
        for o in odd[pub.lines_from(tag):]:  # those an interrupted import spooled are not added again
            pub.add_line(json.dumps(o.evidence(), ensure_ascii=True, separators=(",", ":")), "stdout", ts_ms,
                         {"src.table": o.table, "src.session_id": o.session, "src.native": "1"}, source=tag)


def _utf8(text: str) -> bool:
    """False for a lone surrogate (a JSON escape in model_config_json): no raw entry can carry it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _odd_of(prep: Prepared, new: list[tuple[SourceMessage, str]]) -> tuple[OddValue, ...]:
    """The odd values this import publishes: those of its new messages, and the session's and the
    usage's when the run ends now."""
    out = [o for m, _k in new for o in m.odd]
    return tuple(out) + (prep.odd if prep.final else ())


def parse_since(text: str) -> datetime:
    t = text.strip()
    if t.endswith(("Z", "z")):
        t = t[:-1] + "+00:00"
    try:
        dt = datetime.fromisoformat(t)
    except ValueError:
        raise ImportError_(f"invalid --since {text!r}: expected YYYY-MM-DD or an ISO 8601 time") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt


def eprint(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
