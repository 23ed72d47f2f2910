"""Archive benchmark: segment writes against a plain Parquet write, bytes per line, replay from the archive.

Corpus: the shared goose transcripts' lines as raw entries the way a tap writes them (run, seq,
ts, line, host, format fields), each transcript as its own run, repeated to about ``--lines``
entries over ``--shards`` shards, with stream ids as Redis would give them.

Variants, interleaved over ``--rounds`` rounds in the same process (CPU speed drifts here by up to
40 %: compare only within a run), each writing the same rows in segments of ``--segment`` entries:
- ``floor``: a plain pyarrow Parquet write of the same rows: the rows as Python dicts of the same
  columns (prepared beforehand, not timed), ``pa.Table.from_pylist`` with the same schema,
  ``pq.write_table`` (zstd) to a local file. The target's floor (archive >= 0.5 of it);
- ``write only``: ``pq.write_table`` of the same Arrow table built beforehand (not timed): what
  Parquet encoding and zstd alone cost, to show where the rest of the time goes;
- ``archive``: the archive's write path: ``encode_raw_segment`` (services/archive/segments.py)
  and ``ArchiveStore.create`` to a ``file://`` store (a whole-object create-only put, as the consumer
  does since issue 32), plus the positions record it replaces after each segment;
- ``archive, dict per field``: the same put, the segment encoded by ``encode_dicts`` below, the
  encoder as it was before ``encode_raw_segment`` built the ``fields`` column from flat arrays
  (one Python dict per field; same schema, same decoded entries, checked below): what the flat
  arrays gained, in the same run.

Then, from what ``archive`` wrote:
- **bytes per raw line** in the archive (object bytes / entries) against what the same entries
  cost in Redis (``MEMORY USAGE`` of the shard streams of a private ``redis-server`` filled with
  them: the ~571 B/line figure of docs/scaling.md, measured again here);
- **decode only**: lines/s of ``decode_raw_segment`` over the objects' bytes in memory, against
  ``decode_before`` below (the decoder before its flat-array rewrite), interleaved;
- **replay from the archive**: lines/s of ``read_raw`` (list, get, decode, window filter) plus
  ``merge``, and of the whole replay (that plus ``rebuild``, which a Redis replay pays too).

Results are printed and written to ``bench/results/archive.txt`` (``--out``).

    python bench/archive.py [--lines 200000] [--segment 50000] [--rounds 5] [--shards 4]
"""

from __future__ import annotations

import argparse
import io
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from services.archive import reader  # noqa: E402
from services.archive.segments import (  # noqa: E402
    RAW_SCHEMA,
    ArchivedEntry,
    decode_raw_segment,
    encode_raw_segment,
    raw_segment_key,
)
from services.archive.store import open_store  # noqa: E402
from services.archive.window import Window  # noqa: E402
from services.normalizer import Limits  # noqa: E402
from services.sequencer.rebuild import rebuild  # noqa: E402
from services.settings import Settings  # noqa: E402
from tests.support.fixtures import TRANSCRIPTS, transcript_lines  # noqa: E402

T0 = 1_790_000_000_000


def corpus(total: int, shards: int) -> list[list[ArchivedEntry]]:
    """Per shard, the entries in stream-id order (each run: its lines and an eof)."""
    transcripts = [transcript_lines(p) for p in TRANSCRIPTS]
    out: list[list[ArchivedEntry]] = [[] for _ in range(shards)]
    n = 0
    copy = 0
    ms = T0
    while n < total:
        for t, lines in enumerate(transcripts):
            run = f"fleet-host-{copy % 97}/bench/{copy}/{t}"
            shard = (copy + t) % shards
            for seq, line in enumerate([*lines, None]):
                ms += 1
                fields = {b"run": run.encode(), b"seq": str(seq).encode(), b"ts": str(ms).encode()}
                if line is None:
                    fields[b"kind"] = b"eof"
                    fields[b"exit"] = b"0"
                else:
                    fields[b"line"] = line.encode()
                fields[b"host"] = f"fleet-host-{copy % 97}".encode()
                fields[b"format"] = b"goose"
                out[shard].append(ArchivedEntry(shard, "raw", f"{ms}-0", fields))
                n += 1
        copy += 1
    return out


def segments_of(shards: list[list[ArchivedEntry]], size: int) -> list[list[ArchivedEntry]]:
    return [entries[i:i + size] for entries in shards for i in range(0, len(entries), size)]


def floor_table(segment: list[ArchivedEntry]) -> pa.Table:
    """The same rows and columns as an Arrow table (built outside the timed part)."""
    f = [e.fields for e in segment]
    ids = [e.id for e in segment]
    ms_seq = [i.split("-") for i in ids]
    seq: list[int | None] = []
    for x in f:
        try:
            seq.append(int(x[b"seq"]))
        except (KeyError, ValueError):
            seq.append(None)
    table = pa.table([
        pa.array([e.shard for e in segment], pa.int32()),
        pa.array([e.stream for e in segment], pa.string()),
        pa.array(ids, pa.string()),
        pa.array([int(a) for a, _ in ms_seq], pa.int64()),
        pa.array([int(b) for _, b in ms_seq], pa.int64()),
        pa.array([x.get(b"run", b"").decode() for x in f], pa.string()),
        pa.array(seq, pa.int64()),
        pa.array([x.get(b"kind", b"line").decode() for x in f], pa.string()),
        pa.array([x.get(b"ts", b"").decode() for x in f], pa.string()),
        pa.array([x.get(b"line") for x in f], pa.binary()),
        pa.array([[{"name": k, "value": v} for k, v in x.items()] for x in f], RAW_SCHEMA.field("fields").type),
    ], schema=RAW_SCHEMA)
    return table


def floor_rows(table: pa.Table) -> list[dict[str, object]]:
    """The same rows as Python dicts (what a plain program holds before it writes Parquet)."""
    rows: list[dict[str, object]] = table.to_pylist()
    return rows


def rows_write(rows: list[dict[str, object]], directory: Path) -> int:
    """A plain Parquet write of Python rows: from_pylist + write_table (zstd) + a local file."""
    return floor_write(pa.Table.from_pylist(rows, schema=RAW_SCHEMA), directory)


def floor_write(table: pa.Table, directory: Path) -> int:
    """A plain Parquet write (zstd) of a prebuilt table to a local file."""
    path = directory / f"floor-{table.column('shard')[0]}-{table.column('id')[0]}.parquet"
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    path.write_bytes(sink.getvalue())
    return table.num_rows


def archive_write(store, segment: list[ArchivedEntry], encode=encode_raw_segment) -> int:  # type: ignore[no-untyped-def]
    """As the consumer writes a segment since issue 32: a create-only put under its first and last
    id, then the small positions record replaced."""
    key = raw_segment_key("raw", segment[0].shard, segment[0].id, segment[-1].id)
    created = store.create(key, encode(segment))
    assert created, key  # each variant writes to a store of its own, emptied every round
    store.put("_goose-ingest/positions/bench.json", b'{"streams": {"raw": "%s"}}' % segment[-1].id.encode())
    return len(segment)


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode("utf-8", errors="replace")


def _int(value: bytes | None) -> int | None:
    try:
        return None if value is None else int(value)
    except ValueError:
        return None


def encode_dicts(records: list[ArchivedEntry]) -> bytes:
    """The encoder before the flat arrays: the same table with one Python dict per field (the path
    tests/test_archive_format.py keeps as its reference), default Parquet options."""
    cols: list[list[object]] = [[] for _ in range(11)]
    for rec in records:
        ms, _, sq = rec.id.partition("-")
        f = rec.fields
        for col, value in zip(cols, (rec.shard, rec.stream, rec.id, int(ms), int(sq or 0), _text(f.get(b"run")),
                                     _int(f.get(b"seq")), _text(f.get(b"kind")), _text(f.get(b"ts")), f.get(b"line"),
                                     [{"name": k, "value": v} for k, v in f.items()]),
                              strict=True):
            col.append(value)
    arrays = [pa.array(c, t.type) for c, t in zip(cols, RAW_SCHEMA, strict=True)]
    sink = io.BytesIO()
    pq.write_table(pa.Table.from_arrays(arrays, schema=RAW_SCHEMA), sink, compression="zstd")
    return sink.getvalue()


def decode_before(data: bytes) -> list[ArchivedEntry]:
    """decode_raw_segment as it was before its flat-array rewrite (the same columns read, one
    to_pylist per array, a keyword-built entry each, the cyclic collector left running)."""
    table = pq.read_table(pa.BufferReader(data), columns=["shard", "stream", "id", "fields"])
    lists = table.column("fields").combine_chunks()
    offsets = lists.offsets.to_pylist()
    names = lists.values.field("name").to_pylist()
    values = lists.values.field("value").to_pylist()
    return [ArchivedEntry(shard=s, stream=k, id=i, fields=dict(zip(names[lo:hi], values[lo:hi], strict=True)))
            for s, k, i, lo, hi in zip(table.column("shard").to_pylist(), table.column("stream").to_pylist(),
                                       table.column("id").to_pylist(), offsets[:-1], offsets[1:], strict=True)]


def decode_all(decode: Callable[[bytes], list[ArchivedEntry]], objects: list[bytes]) -> int:
    """Every object decoded, all of them held until the end (as read_raw holds them)."""
    held = [decode(o) for o in objects]
    return sum(map(len, held))


def timed(fn: Callable[[], int]) -> float:
    t = time.perf_counter()
    n = fn()
    return n / (time.perf_counter() - t)


def redis_bytes_per_line(shards: list[list[ArchivedEntry]]) -> float:
    """MEMORY USAGE of the shard streams of a private redis-server holding the same entries."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        r = redis.Redis(port=port)
        for _ in range(100):
            try:
                r.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        total = 0
        n = 0
        for i, entries in enumerate(shards):
            stream = f"goose.raw.{i}"
            pipe = r.pipeline(transaction=False)
            for e in entries:
                pipe.xadd(stream, e.fields, id=e.id)  # type: ignore[arg-type]
                n += 1
                if len(pipe) >= 1000:
                    pipe.execute()
            pipe.execute()
            total += int(r.memory_usage(stream, samples=0) or 0)
        return total / n
    finally:
        proc.terminate()
        proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lines", type=int, default=200_000)
    ap.add_argument("--segment", type=int, default=50_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "archive.txt"))
    args = ap.parse_args()

    shards = corpus(args.lines, args.shards)
    segs = segments_of(shards, args.segment)
    lines = sum(len(s) for s in segs)
    raw_bytes = sum(len(v) for s in segs for e in s for v in e.fields.values())
    work = Path(tempfile.mkdtemp(prefix="bench-archive-"))
    out: list[str] = []

    def say(text: str) -> None:
        print(text, flush=True)
        out.append(text)

    say(f"corpus: {lines} raw entries ({raw_bytes / lines:.0f} B of field values per entry), {args.shards} shards, "
        f"segments of {args.segment} entries ({len(segs)} segments), {args.rounds} rounds interleaved")
    tables = [floor_table(s) for s in segs]
    rows = [floor_rows(t) for t in tables]
    assert decode_raw_segment(encode_dicts(segs[0])) == decode_raw_segment(encode_raw_segment(segs[0])) == segs[0]
    results: dict[str, list[float]] = {"floor": [], "write only": [], "archive": [], "archive, dict per field": []}
    ratios: list[float] = []
    dict_ratios: list[float] = []
    store_dir = work / "store"
    try:
        for rnd in range(args.rounds):
            (work / "floor").mkdir(exist_ok=True)
            shutil.rmtree(store_dir, ignore_errors=True)
            store = open_store(Settings(archive_url=f"file://{store_dir}"))  # type: ignore[call-arg]
            shutil.rmtree(work / "store-dicts", ignore_errors=True)
            dict_store = open_store(Settings(archive_url=f"file://{work / 'store-dicts'}"))  # type: ignore[call-arg]
            order = ["floor", "write only", "archive", "archive, dict per field"]
            order = order[rnd % 4:] + order[:rnd % 4]  # rotated: no variant always first
            got: dict[str, float] = {}
            for name in order:
                if name == "floor":
                    got[name] = timed(lambda: sum(rows_write(r, work / "floor") for r in rows))
                elif name == "write only":
                    got[name] = timed(lambda: sum(floor_write(t, work / "floor") for t in tables))
                elif name == "archive":
                    got[name] = timed(lambda: sum(archive_write(store, s) for s in segs))  # noqa: B023
                else:
                    got[name] = timed(lambda: sum(archive_write(dict_store, s, encode_dicts) for s in segs))  # noqa: B023
                results[name].append(got[name])
            ratios.append(got["archive"] / got["floor"])
            dict_ratios.append(got["archive, dict per field"] / got["floor"])
            say(f"round {rnd + 1}: floor {got['floor']:,.0f} lines/s, write only {got['write only']:,.0f} lines/s, "
                f"archive {got['archive']:,.0f} lines/s (ratio {ratios[-1]:.2f}), dict per field (before) "
                f"{got['archive, dict per field']:,.0f} lines/s (ratio {dict_ratios[-1]:.2f})")
        say(f"write: floor median {statistics.median(results['floor']):,.0f} lines/s, write-only median "
            f"{statistics.median(results['write only']):,.0f} lines/s, archive median "
            f"{statistics.median(results['archive']):,.0f} lines/s, ratio archive/floor median {statistics.median(ratios):.2f} "
            f"(min {min(ratios):.2f}, max {max(ratios):.2f}; target >= 0.5)")
        say(f"before: archive with a dict per field median {statistics.median(results['archive, dict per field']):,.0f} "
            f"lines/s, ratio to floor median {statistics.median(dict_ratios):.2f} "
            f"(min {min(dict_ratios):.2f}, max {max(dict_ratios):.2f})")

        archived = sum(p.stat().st_size for p in store_dir.rglob("*.parquet"))
        in_redis = redis_bytes_per_line(shards)
        say(f"bytes per raw line: archive {archived / lines:.1f} B (Parquet zstd, every field byte-exact), "
            f"Redis {in_redis:.1f} B (MEMORY USAGE, same entries, single node): {in_redis / (archived / lines):.1f}x smaller")
        # The corpus repeats 8 transcripts, which zstd folds away: an optimistic figure. Without any
        # repetition (each transcript once, in one segment) is the pessimistic one for real fleets,
        # whose runs share structure (JSON keys, tool names, paths) but not content.
        once = corpus(1, 1)[0]
        unique = len(encode_raw_segment(once)) / len(once)
        say(f"bytes per raw line without repetition (each transcript once, one segment of {len(once)} entries): "
            f"{unique:.1f} B: {in_redis / unique:.1f}x smaller than Redis")

        # Decode alone, the objects' bytes already in memory, every decoded segment held until the
        # round ends (as read_raw holds them): the current decoder against the one before it.
        objects = [p.read_bytes() for p in sorted(store_dir.rglob("*.parquet"))]
        assert [e for o in objects for e in decode_raw_segment(o)] == [e for o in objects for e in decode_before(o)]
        decodes: dict[str, list[float]] = {"now": [], "before": []}
        for rnd in range(args.rounds):
            for name in (["now", "before"] if rnd % 2 == 0 else ["before", "now"]):
                fn = decode_raw_segment if name == "now" else decode_before
                decodes[name].append(timed(lambda: decode_all(fn, objects)))  # noqa: B023
        say(f"decode only (decode_raw_segment, bytes in memory): median {statistics.median(decodes['now']):,.0f} lines/s; "
            f"the decoder before (a to_pylist per array, collector running) {statistics.median(decodes['before']):,.0f} "
            f"lines/s; ratio {statistics.median(a / b for a, b in zip(decodes['now'], decodes['before'], strict=True)):.2f}")

        store = open_store(Settings(archive_url=f"file://{store_dir}"))  # type: ignore[call-arg]
        settings = Settings()
        limits = Limits(settings.max_span_chars, settings.max_pending_tools, settings.max_pending_tool_bytes)
        reads: list[float] = []
        replays: list[float] = []
        for _ in range(args.rounds):
            t = time.perf_counter()
            got_read = reader.read_raw(store, Window())
            merged = reader.merge(got_read.entries, [], Window())
            t_read = time.perf_counter() - t
            log = reader.log_of(merged, None)
            t2 = time.perf_counter()
            rebuilt = rebuild(log, limits, settings.max_buffered_entries, None, settings.max_line_bytes,
                              settings.redactor(), settings.max_held_bytes)
            t_rebuild = time.perf_counter() - t2
            assert len(merged) == lines and not got_read.corrupt and not rebuilt.failed
            reads.append(lines / t_read)
            replays.append(lines / (t_read + t_rebuild))
        say(f"replay from the archive: read+decode+merge median {statistics.median(reads):,.0f} lines/s; "
            f"whole replay (that + rebuild) median {statistics.median(replays):,.0f} lines/s")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(f"$ python bench/archive.py --lines {args.lines} --segment {args.segment} "
                              f"--rounds {args.rounds} --shards {args.shards}\n" + "\n".join(out) + "\n")


if __name__ == "__main__":
    main()
