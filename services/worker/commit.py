"""The Python half of the atomic commit (`commit.lua` beside it): what one commit writes, as typed
records, and their encoding into the script's single msgpack argument.

One commit = one shard: its raw stream's acknowledgements, the states (and held entries) of the
runs routed to it, and outputs to that shard's topic partitions; in cluster mode every key carries
the shard's hash tag (contracts/keys.py), so the script stays in one slot.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import IntEnum
from importlib import resources
from typing import Any, NamedTuple

import msgpack
import orjson
from redis.exceptions import ResponseError

from services.broker.errors import is_transient
from services.sequencer import Entry, HeldChanges

COMMIT_LUA = resources.files("services.worker").joinpath("commit.lua").read_text()
# Redis bundles an old lua-cmsgpack: no bin or str8 types, so pack bytes and str as raw.
_packb = msgpack.Packer(use_bin_type=False).pack
HELD_PREFIX = b"h:"  # hash field of a held entry in the run's state hash: h:<seq>
CALL_PREFIX = b"c:"  # hash field of a pending tool call's block: c:<key> (RunNormalizer.take_call_changes)
VERSION_FIELD, STATE_FIELD = b"v", b"s"


class ReplyCode(IntEnum):
    """The first element of commit.lua's reply (the script names them alike: tests/worker/test_commit_lua_names.py)."""

    CONFLICT = 0  # followed by the 1-based indexes of the runs whose version moved; nothing written
    COMMITTED = 1
    LEASE_LOST = 2  # the shard's lease names another worker (or nobody); nothing written
    RETAKEN = 3  # committed, after taking back the shard's lease that had expired under the batch


class RunArgs(NamedTuple):
    """One run as commit.lua receives it, in this order; the script unpacks it into locals of these
    names (tests/worker/test_commit_lua_names.py holds them equal)."""

    key: str  # the run's state hash
    version: str  # expected current version
    state: bytes
    ended: int  # 0/1
    run: str  # the run key (member of the active-runs zset)
    last_ms: int  # score in the active-runs zset
    held_set: list[bytes]  # field, value, ... to write (held entries, pending calls' blocks)
    held_del: list[bytes]  # fields to delete


class LeaseLost(RuntimeError):
    """The shard's lease names another worker (or nobody): nothing was written, the entries stay
    pending for the shard's owner."""


class CommitFailed(RuntimeError):
    """Redis refused the commit script itself (e.g. a value above its limits): not a conflict."""


class Output(NamedTuple):
    """One stream entry to append: the same fields to each of `streams` (an event goes to the
    all-events partition and its type's partition)."""

    streams: tuple[str, ...]
    fields: tuple[bytes | str, ...]  # field, value, field, value, ...


class RunWrite(NamedTuple):
    """A run's new state, version-checked against the one it was computed from."""

    key: str
    version: str  # expected current version ("0": no state yet)
    state: bytes
    ended: bool
    run: str
    last_ms: int  # last activity (Redis clock), the score in the shard's active-runs set
    held: HeldChanges


@dataclass
class Commit:
    """Everything one call of commit.lua writes."""

    raw_stream: str
    group: str
    active_runs: str
    ttl_ms: int
    runs: list[RunWrite] = field(default_factory=list)
    acks: list[str] = field(default_factory=list)
    outputs: list[Output] = field(default_factory=list)
    # The shard's lease key and this worker (services/worker/leases.py): the script writes nothing
    # unless the lease still names it. Empty: no lease is checked (leases off, tests, tools).
    lease: str = ""
    owner: str = ""
    lease_ttl_ms: int = 0  # for taking back a lease that expired under the batch (commit.lua)
    claim_idle_ms: int = 0  # a refused batch's entries are made this idle, for the owner's next sweep
    retaken: bool = False  # set by `Committer.commit`: the commit took the lease back


def held_field(seq: int) -> bytes:
    return HELD_PREFIX + str(seq).encode()


def encode_held(entry: Entry) -> bytes:
    return orjson.dumps(entry.to_list())


def call_field(key: int) -> bytes:
    return CALL_PREFIX + str(key).encode()


def decode_calls(fields: dict[bytes, bytes]) -> dict[int, Any]:
    """Pending tool calls' blocks from a run's state hash (HGETALL), by key, as stored."""
    return {int(name[len(CALL_PREFIX):]): orjson.loads(value)
            for name, value in fields.items() if name.startswith(CALL_PREFIX)}


def decode_held(fields: dict[bytes, bytes]) -> dict[int, Entry]:
    """Held entries from a run's state hash (HGETALL)."""
    out: dict[int, Entry] = {}
    for name, value in fields.items():
        if name.startswith(HELD_PREFIX):
            entry = Entry.from_list(orjson.loads(value))
            out[entry.seq] = entry
    return out


def _argv(commit: Commit) -> list[Any]:
    now_ms = int(time.time() * 1000)
    runs = []
    for w in commit.runs:
        held_set: list[bytes] = []
        for entry in w.held.added:
            held_set += [held_field(entry.seq), encode_held(entry)]
        held_del = [held_field(seq) for seq in w.held.removed]
        for key, data in w.held.calls_added:
            held_set += [call_field(key), data]
        held_del += [call_field(key) for key in w.held.calls_removed]
        runs.append(RunArgs(w.key, w.version, w.state, 1 if w.ended else 0, w.run, w.last_ms or now_ms, held_set, held_del))
    outputs = [(o.streams, o.fields) for o in commit.outputs]
    return [commit.group, commit.active_runs, str(commit.ttl_ms), _packb((runs, commit.acks, outputs)),
            commit.lease, commit.owner, str(commit.lease_ttl_ms), str(commit.claim_idle_ms)]


class Committer:
    """Runs commit.lua. `commit` returns the indexes (0-based, into `Commit.runs`) of runs whose
    version moved (nothing was written then), or an empty list when everything was written; it
    raises LeaseLost when the shard is no longer this worker's (`commit.retaken` says whether the
    commit took back a lease that had expired under it)."""

    def __init__(self, client: Any) -> None:
        self.script = client.register_script(COMMIT_LUA)

    async def commit(self, commit: Commit) -> list[int]:
        try:
            reply = await self.script(keys=[commit.raw_stream], args=_argv(commit))
        except ResponseError as exc:
            if is_transient(exc):
                raise  # the broker's state, not this batch's content: the entries stay pending
            raise CommitFailed(type(exc).__name__) from exc  # e.g. a value above Redis's limits
        code = int(reply[0])
        if code in (ReplyCode.COMMITTED, ReplyCode.RETAKEN):
            commit.retaken = code == ReplyCode.RETAKEN
            return []
        if code == ReplyCode.LEASE_LOST:
            raise LeaseLost(commit.lease)
        return [int(i) - 1 for i in reply[1:]]
