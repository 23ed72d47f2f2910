"""Every key and stream name of goose-ingest, and shard routing: the one place names are made.

The shard function is CRC-32 (IEEE, as zlib, Go's hash/crc32 and most shippers compute it)
of the UTF-8 run key, modulo the shard count, so shippers in any language route alike.

Two layouts of the same names:

- **single node** (`KeyLayout(cluster=False)`): today's names, unchanged. One topic stream per
  topic (``harness.events``, ``harness.events.<type>``, ``harness.runs``, ``goose.deadletter``);
  raw shards ``goose.raw.<i>``.
- **cluster** (`KeyLayout(cluster=True)`): everything that belongs to shard *i* carries the hash
  tag ``{s<i>}``, so a shard's raw stream, its runs' states, its active-run index, its import
  checkpoints and its topic partitions live in one slot and ``commit.lua`` stays one atomic
  script. Topics are partitioned by shard: ``harness.events.{s3}`` is partition 3 of
  ``harness.events``.

Every name takes the namespace prefix ``<ns>:`` when one is set.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

# Key families (the part after the namespace). Topic and stream base names come from Settings.
RUN_STATE = "goose-ingest:run"
ACTIVE_RUNS = "goose-ingest:active"
IMPORT_CHECKPOINT = "goose-ingest:import"
EXPORT_STATE = "goose-ingest:export"
EXPORT_OPEN = "goose-ingest:export-open"  # sorted set run -> last activity ms of an exporter's open runs
# An exporter's state per consumer group (issue 20 item 5): two groups of one exporter (two OTLP
# backends, a re-export from scratch) each keep their own. EXPORT_STATE / EXPORT_OPEN hold the
# state of exporters from before, shared by every group; `export otlp` adopts it at start.
EXPORT_GROUP_STATE = "goose-ingest:export-group"
EXPORT_GROUP_OPEN = "goose-ingest:export-group-open"
META = "goose-ingest:meta"  # deployment facts (the shard count the data was created with)
LEASE = "goose-ingest:lease"  # which worker reads a shard (string: owner, with a TTL)
# The archive's own keys, per consumer group: its lease (one archive per group) and the id of the
# deployment whose archive store it writes (issue 32, docs/archive.md "Guarantees").
ARCHIVE = "goose-ingest:archive"
WORKERS = "goose-ingest:workers"  # sorted set worker -> until when it counts as alive (ms)
GATEWAY_TOKEN = "goose-ingest:token"  # hash per gateway token: its SHA-256, prefix, labels (never the token)
GATEWAY_TOKENS = "goose-ingest:tokens"  # set of the gateway token ids (for `tokens list`)
# Sorted sets (hashed run or host -> ms of its last failure) behind the workers' runs/hosts gauges per
# error class and per tool, and per (tool, host) tallies of a window (services/worker/spread.py).
SPREAD = "goose-ingest:spread"


def group_segment(group: str) -> str:
    """A consumer group's name as one key segment: `%`, `:` and the hash-tag braces percent-encoded,
    so the segment ends at the next `:` and a brace in a group name never moves a key's slot."""
    return "".join(f"%{ord(c):02X}" if c in "%:{}" else c for c in group)


def shard_of(run: str, shards: int) -> int:
    return zlib.crc32(run.encode("utf-8")) % shards


@dataclass(frozen=True)
class KeyLayout:
    namespace: str = ""
    shards: int = 4
    cluster: bool = False
    raw_prefix: str = "goose.raw"
    control_prefix: str = "goose.control"
    events_topic: str = "harness.events"
    runs_topic: str = "harness.runs"
    deadletter_stream: str = "goose.deadletter"

    # ------------------------------------------------------------------ basics
    def key(self, name: str) -> str:
        return f"{self.namespace}:{name}" if self.namespace else name

    def tag(self, shard: int) -> str:
        """The hash tag of a shard's keys (cluster only; empty on a single node)."""
        return f"{{s{shard}}}" if self.cluster else ""

    def shard_of(self, run: str) -> int:
        return shard_of(run, self.shards)

    def _partition(self, base: str, shard: int) -> str:
        return self.key(f"{base}.{self.tag(shard)}") if self.cluster else self.key(base)

    def _partitions(self, base: str) -> list[str]:
        if not self.cluster:
            return [self.key(base)]
        return [self._partition(base, i) for i in range(self.shards)]

    # ------------------------------------------------------------------ raw log
    def raw_stream(self, shard: int) -> str:
        return self.key(f"{self.raw_prefix}.{self.tag(shard) if self.cluster else shard}")

    def raw_streams(self) -> list[str]:
        return [self.raw_stream(i) for i in range(self.shards)]

    def control_stream(self, shard: int) -> str:
        """Worker-written control entries (abandon markers) of a shard: no tap may write here."""
        return self.key(f"{self.control_prefix}.{self.tag(shard) if self.cluster else shard}")

    def control_streams(self) -> list[str]:
        return [self.control_stream(i) for i in range(self.shards)]

    # ------------------------------------------------------------------ per-run / per-shard keys
    def run_state(self, run: str) -> str:
        if self.cluster:
            return self.key(f"{RUN_STATE}:{self.tag(self.shard_of(run))}:{run}")
        return self.key(f"{RUN_STATE}:{run}")

    def active_runs(self, shard: int) -> str:
        """Sorted set run -> last activity ms of the shard's open runs (one set on a single node)."""
        return self.key(f"{ACTIVE_RUNS}:{self.tag(shard)}") if self.cluster else self.key(ACTIVE_RUNS)

    def active_run_sets(self) -> list[str]:
        return sorted(set(self.active_runs(i) for i in range(self.shards)))

    def import_checkpoint(self, base: str) -> str:
        """Checkpoint of an imported session whose first run key is `base`."""
        if self.cluster:
            return self.key(f"{IMPORT_CHECKPOINT}:{self.tag(self.shard_of(base))}:{base}")
        return self.key(f"{IMPORT_CHECKPOINT}:{base}")

    def export_state(self, exporter: str, run: str) -> str:
        """Per-run state of an exporter (`otlp`, `postgres`): in the slot of the run's partitions."""
        if self.cluster:
            return self.key(f"{EXPORT_STATE}:{exporter}:{self.tag(self.shard_of(run))}:{run}")
        return self.key(f"{EXPORT_STATE}:{exporter}:{run}")

    def export_open_runs(self, exporter: str, shard: int) -> str:
        """Runs an exporter has open (e.g. a trace whose root is not out), in the shard's slot."""
        return self.key(f"{EXPORT_OPEN}:{exporter}:{self.tag(shard)}") if self.cluster else self.key(f"{EXPORT_OPEN}:{exporter}")

    def export_open_run_sets(self, exporter: str) -> list[str]:
        return sorted(set(self.export_open_runs(exporter, i) for i in range(self.shards)))

    def export_group_state(self, exporter: str, group: str, run: str) -> str:
        """Per-run state of one consumer group of an exporter, in the slot of the run's partitions."""
        base = f"{EXPORT_GROUP_STATE}:{exporter}:{group_segment(group)}"
        if self.cluster:
            return self.key(f"{base}:{self.tag(self.shard_of(run))}:{run}")
        return self.key(f"{base}:{run}")

    def export_group_open_runs(self, exporter: str, group: str, shard: int) -> str:
        """The runs one consumer group of an exporter has open, in the shard's slot."""
        base = f"{EXPORT_GROUP_OPEN}:{exporter}:{group_segment(group)}"
        return self.key(f"{base}:{self.tag(shard)}") if self.cluster else self.key(base)

    def export_group_open_run_sets(self, exporter: str, group: str) -> list[str]:
        return sorted(set(self.export_group_open_runs(exporter, group, i) for i in range(self.shards)))

    def meta(self) -> str:
        return self.key(META)

    def shard_lease(self, shard: int) -> str:
        """The lease of a shard: the one worker that reads it (in the shard's slot, so the commit
        script checks it atomically with what it writes)."""
        return self.key(f"{LEASE}:{self.tag(shard) if self.cluster else shard}")

    def archive_lease(self, group: str) -> str:
        """The one archive process of a consumer group (string: its token, with a TTL)."""
        return self.key(f"{ARCHIVE}:{group_segment(group)}:lease")

    def archive_identity(self, group: str) -> str:
        """The id of the deployment an archive group writes its store for (string, no TTL)."""
        return self.key(f"{ARCHIVE}:{group_segment(group)}:deployment")

    def workers(self) -> str:
        """The live workers (for each one's fair share of the shards)."""
        return self.key(WORKERS)

    def spread(self, family: str, label: str, kind: str) -> str:
        """One sorted set of distinct runs or hosts (hashed) failing in an error class or a tool
        (`family` class|tool, `label` the bounded metric label, `kind` runs|hosts|calling; or family
        `hosts`, label `all`, kind active|errors: the fleet's hosts with any event / an `error`).
        Fleet-wide, no hash tag: never used with another key in one command."""
        return self.key(f"{SPREAD}:{family}:{label}:{kind}")

    def spread_tally(self, tool: str, host: str) -> str:
        """A host's calls and failures of a tool in its current window (hash; `host` hashed)."""
        return self.key(f"{SPREAD}:tally:{tool}:{host}")

    def gateway_token(self, token_id: str) -> str:
        """One gateway token's record (services/gateway/tokens.py): its hash, prefix and labels."""
        return self.key(f"{GATEWAY_TOKEN}:{token_id}")

    def gateway_tokens(self) -> str:
        """The ids of every gateway token."""
        return self.key(GATEWAY_TOKENS)

    # ------------------------------------------------------------------ topics
    def events_partition(self, shard: int) -> str:
        return self._partition(self.events_topic, shard)

    def type_partition(self, event_type: str, shard: int) -> str:
        return self._partition(f"{self.events_topic}.{event_type}", shard)

    def runs_partition(self, shard: int) -> str:
        return self._partition(self.runs_topic, shard)

    def deadletter_partition(self, shard: int) -> str:
        return self._partition(self.deadletter_stream, shard)

    def events_partitions(self) -> list[str]:
        """Every stream of the all-events topic (one on a single node, one per shard on a cluster)."""
        return self._partitions(self.events_topic)

    def type_partitions(self, event_type: str) -> list[str]:
        return self._partitions(f"{self.events_topic}.{event_type}")

    def runs_partitions(self) -> list[str]:
        return self._partitions(self.runs_topic)

    def deadletter_partitions(self) -> list[str]:
        return self._partitions(self.deadletter_stream)

    def export_deadletter_partition(self, exporter: str, shard: int) -> str:
        """Dead letters of an exporter (`<deadletter>.<exporter>`): exports a target refused."""
        return self._partition(f"{self.deadletter_stream}.{exporter}", shard)

    def export_deadletter_partitions(self, exporter: str) -> list[str]:
        return self._partitions(f"{self.deadletter_stream}.{exporter}")
