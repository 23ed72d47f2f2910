"""`replay` over the archive plus Redis (services/archive/reader.py, services/replay/command.py).

Pure parts first (windows, which segments, the merge of two overlapping copies of the log); then
real processes: fixture transcripts through `goose-ingest publish` and a worker, the log archived,
Redis trimmed as a short retention would, and `goose-ingest replay` run as a process.
"""

from __future__ import annotations

import re
import time

import pytest

from services.archive import reader
from services.archive.segments import raw_segment_key
from services.archive.window import DAY_MS, Window, parse_time, window
from services.broker.connect import sync_client
from services.settings import ConfigError
from tests.support.archive_reading import archive_from_redis, cli, file_store, publish_runs, runs_of, trim_to
from tests.support.pipeline import ended_runs, start_worker, stop, wait_until

NOW = 1_796_000_000_000  # 2026-11-30T...Z


# ---------------------------------------------------------------------------------- pure


def test_times_parse_as_dates_times_and_times_ago():
    assert parse_time("2026-12-01", "--since") == 1_796_083_200_000
    assert parse_time("2026-12-01T00:00:00Z", "--since") == 1_796_083_200_000
    assert parse_time("2026-12-01T01:00:00+01:00", "--since") == 1_796_083_200_000
    assert parse_time("90m", "--since", now_ms=NOW) == NOW - 90 * 60_000
    assert parse_time("2d", "--since", now_ms=NOW) == NOW - 2 * DAY_MS
    assert parse_time("1.5h", "--since", now_ms=NOW) == NOW - 5_400_000


@pytest.mark.parametrize("text", ["yesterday", "3 hours", "2026-13-01", "-5m", ""])
def test_a_time_that_does_not_parse_is_one_clear_error(text):
    with pytest.raises(ConfigError) as exc:
        parse_time(text, "--since")
    assert "--since" in str(exc.value) and "\n" not in str(exc.value)


def test_an_empty_window_is_refused():
    with pytest.raises(ConfigError, match="not after --since"):
        window("2026-12-02", "2026-12-01")
    assert window(None, None).everything


def test_a_window_lists_its_dates_and_the_day_before():
    w = Window(parse_time("2026-12-02T10:00:00Z", "--since"), parse_time("2026-12-03T01:00:00Z", "--until"))
    assert w.dates() == ["2026-12-01", "2026-12-02", "2026-12-03"]
    assert Window().dates() is None


def _ref(kind: str, shard: int, ms: int) -> reader.SegmentRef:
    sid = f"{ms}-0"
    return reader.SegmentRef(raw_segment_key(kind, shard, sid, sid), kind, shard, sid)


def test_segments_of_a_window_include_the_one_that_started_before_it():
    refs = [_ref("raw", 0, ms) for ms in (100, 200, 300, 400)] + [_ref("raw", 1, 50), _ref("control", 0, 350)]
    chosen = reader.select_segments(refs, Window(250, 400))
    assert [(r.stream, r.shard, r.first_id) for r in chosen] == [
        ("control", 0, "350-0"),  # starts inside
        ("raw", 0, "200-0"),  # the last one before since: its tail may reach into the window
        ("raw", 0, "300-0"),
        ("raw", 1, "50-0"),  # shard 1's only segment starts before: kept
    ]
    assert len(reader.select_segments(refs, Window())) == len(refs)


def test_segment_names_that_are_not_segments_are_reported():
    refs, odd = reader.segment_refs([raw_segment_key("raw", 2, "5-1", "5-1"), "raw/date=2026-12-01/notes.txt"])
    assert [r.shard for r in refs] == [2]
    assert [o.key for o in odd] == ["raw/date=2026-12-01/notes.txt"]


def test_the_merge_keeps_one_copy_of_the_overlap_in_stream_id_order():
    def at(kind, shard, sid, run="r"):
        return reader.Located(kind, shard, sid, {b"run": run.encode(), b"seq": b"0"})

    archived = [at("raw", 0, "10-0"), at("raw", 0, "12-0"), at("raw", 1, "12-0"), at("control", 0, "13-0")]
    live = [at("raw", 0, "12-0"), at("raw", 0, "15-0"), at("raw", 1, "9-0", run="early")]
    merged = reader.merge(archived, live, Window())
    assert [(e.stream, e.shard, e.sid) for e in merged] == [
        ("raw", 1, "9-0"), ("raw", 0, "10-0"), ("raw", 0, "12-0"), ("raw", 1, "12-0"), ("control", 0, "13-0"),
        ("raw", 0, "15-0")]
    # A window selects runs: a run with one raw entry inside is in, control entries do not select.
    assert reader.runs_in(merged, Window(9, 10)) == {"early"}
    assert reader.runs_in(merged, Window(13, 14)) == set()
    assert [e.sid for e in reader.log_of(merged, {"early"})] == ["9-0"]


# ---------------------------------------------------------------------------------- live

def _summary(out: str) -> tuple[int, int]:
    m = re.search(r"replay: (\d+) runs? rebuilt from the raw log, (\d+) differ", out)
    assert m, out
    return int(m.group(1)), int(m.group(2))


@pytest.fixture
def archived_pipeline(settings, tmp_path):
    """Two batches of fixture runs a second apart through a real worker, archived, then Redis trimmed
    in the middle of the first batch (its start is only in the archive)."""
    first, second = runs_of("replay/a"), runs_of("replay/b")
    worker = start_worker(settings, tmp_path / "worker.log")
    try:
        publish_runs(settings, first)
        wait_until(lambda: set(first) <= ended_runs(settings), timeout=120)
        time.sleep(1.1)
        between = int(time.time() * 1000)
        time.sleep(0.1)
        publish_runs(settings, second)
        wait_until(lambda: set(second) <= ended_runs(settings), timeout=120)
    finally:
        stop(worker)
    url, store = file_store(settings, tmp_path / "archive")
    keys = archive_from_redis(settings, store)
    r = sync_client(settings)
    ids = sorted((int(sid.split(b"-")[0]), sid) for s in settings.layout.raw_streams() for sid, _ in r.xrange(s)
                 if int(sid.split(b"-")[0]) < between)
    middle = ids[len(ids) // 2][1].decode()
    assert trim_to(settings, middle) > 0
    return {"url": url, "store": store, "keys": keys, "first": first, "second": second, "between": between}


@pytest.mark.e2e
def test_replay_reads_the_archive_and_what_redis_still_holds(settings, archived_pipeline):
    a = archived_pipeline
    done = cli(settings, "replay", "--quiet", GOOSE_INGEST_ARCHIVE_URL=a["url"])
    assert done.returncode == 0, done.stdout + done.stderr
    assert _summary(done.stdout) == (len(a["first"]) + len(a["second"]), 0)
    # Redis alone no longer has the first batch's beginnings: that replay must find differences.
    alone = cli(settings, "replay", "--quiet", "--source", "redis", GOOSE_INGEST_ARCHIVE_URL=a["url"])
    assert alone.returncode == 1 and _summary(alone.stdout)[1] > 0, alone.stdout


@pytest.mark.e2e
def test_replay_of_a_time_window_rebuilds_only_the_runs_in_it(settings, archived_pipeline):
    a = archived_pipeline
    iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(a["between"] / 1000)) + f".{a['between'] % 1000:03d}Z"
    done = cli(settings, "replay", "--since", iso, GOOSE_INGEST_ARCHIVE_URL=a["url"])
    assert done.returncode == 0, done.stdout + done.stderr
    assert _summary(done.stdout) == (len(a["second"]), 0)
    redis_only = cli(settings, "replay", "--since", iso, "--source", "redis")  # the second batch is all in Redis
    assert redis_only.returncode == 0 and _summary(redis_only.stdout) == (len(a["second"]), 0), redis_only.stdout
    before = cli(settings, "replay", "--until", iso, GOOSE_INGEST_ARCHIVE_URL=a["url"])
    assert before.returncode == 0, before.stdout + before.stderr
    assert _summary(before.stdout) == (len(a["first"]), 0)
    one = sorted(a["first"])[0]
    only = cli(settings, "replay", "--until", iso, "--run", one, GOOSE_INGEST_ARCHIVE_URL=a["url"])
    assert only.returncode == 0 and _summary(only.stdout) == (1, 0), only.stdout + only.stderr
    bad = cli(settings, "replay", "--since", "last tuesday", GOOSE_INGEST_ARCHIVE_URL=a["url"])
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--since" in bad.stderr, bad.stderr


@pytest.mark.e2e
def test_a_corrupt_segment_is_named_and_the_rest_is_still_replayed(settings, archived_pipeline):
    a = archived_pipeline
    raw_keys = [k for k in a["keys"] if k.startswith("raw/")]
    victim = raw_keys[0]
    data = a["store"].get(victim)
    a["store"].put(victim, data[: len(data) // 2])  # truncated: a half-written object from another tool
    done = cli(settings, "replay", "--quiet", GOOSE_INGEST_ARCHIVE_URL=a["url"])
    assert done.returncode == 1
    named = [line for line in done.stderr.splitlines() if "corrupt archive object" in line]
    assert len(named) == 1 and victim in named[0], done.stderr
    assert "Traceback" not in done.stderr
    rebuilt, differ = _summary(done.stdout)
    total = len(a["first"]) + len(a["second"])
    assert rebuilt >= total - 1 and differ < total, done.stdout  # the others still compared equal
    assert "1 archive objects could not be read" in done.stdout


@pytest.mark.e2e
def test_replay_from_an_archive_that_is_not_configured_is_one_clear_error(settings):
    done = cli(settings, "replay", "--source", "archive")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "GOOSE_INGEST_ARCHIVE_URL" in done.stderr, done.stderr


@pytest.mark.e2e
def test_replay_and_reprocess_read_the_archive_alone_with_no_broker(settings, archived_pipeline):
    """The broker gone (a demo's or an `up`'s embedded one): the archive's raw log is rebuilt and
    compared with its event lake; reprocess rebuilds and publishes nothing (issue 38 item 2)."""
    a = archived_pipeline
    alone = {"GOOSE_INGEST_ARCHIVE_URL": a["url"], "GOOSE_INGEST_REDIS_URL": ""}
    done = cli(settings, "replay", "--quiet", **alone)
    assert done.returncode == 0, done.stdout + done.stderr
    assert _summary(done.stdout) == (len(a["first"]) + len(a["second"]), 0)
    assert "no broker configured: replaying the archive alone" in done.stderr, done.stderr
    one = sorted(a["second"])[0]
    only = cli(settings, "replay", "--run", one, "--source", "archive", **alone)
    assert only.returncode == 0 and _summary(only.stdout) == (1, 0), only.stdout + only.stderr
    assert "replay: 1 run rebuilt" in only.stdout
    rebuilt = cli(settings, "reprocess", "--since", "2d", **alone)
    assert rebuilt.returncode == 0, rebuilt.stdout + rebuilt.stderr
    assert f"{len(a['first']) + len(a['second'])} runs rebuilt" in rebuilt.stdout and "would publish" in rebuilt.stdout
    assert "nothing published" in rebuilt.stderr and "Traceback" not in rebuilt.stderr
    # without a broker, Redis-only replay has nothing to read: one line
    redis_only = cli(settings, "replay", "--source", "redis", **alone)
    assert redis_only.returncode == 2 and redis_only.stderr.count("\n") == 1, redis_only.stderr


@pytest.mark.parametrize("command", [["replay"], ["replay", "--source", "archive"], ["reprocess", "--since", "1d"]])
@pytest.mark.parametrize("broker", [True, False], ids=["broker", "no-broker"])
def test_an_archive_folder_that_does_not_exist_is_one_line_and_is_not_created(settings, tmp_path, command, broker):
    missing = tmp_path / "no" / "such" / "archive"
    env = {"GOOSE_INGEST_ARCHIVE_URL": missing.as_uri(), **({} if broker else {"GOOSE_INGEST_REDIS_URL": ""})}
    done = cli(settings, *command, **env)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stdout + done.stderr
    assert "does not exist" in done.stderr and str(missing) in done.stderr and done.stdout == "", done.stderr
    assert not (tmp_path / "no").exists()


@pytest.mark.parametrize("command", [["replay"], ["reprocess", "--since", "1d"]])
def test_an_empty_archive_with_no_broker_is_one_line(settings, tmp_path, command):
    empty = tmp_path / "archive"
    empty.mkdir()
    done = cli(settings, *command, GOOSE_INGEST_ARCHIVE_URL=empty.as_uri(), GOOSE_INGEST_REDIS_URL="")
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stdout + done.stderr
    assert "holds no raw log segment" in done.stderr and done.stdout == "", done.stderr


def test_a_run_that_crosses_the_window_edges_is_read_whole(settings, tmp_path):
    """A run with one entry inside the window is rebuilt from its entries before `since` (in an
    earlier date partition of the archive) and after `until` (only in Redis) too."""
    from services.archive.segments import ArchivedEntry, encode_raw_segment

    day = 1_796_083_200_000  # 2026-12-01T00:00:00Z
    hour = 3_600_000

    def entry(ms: int, seq: int, run: str = "edge") -> ArchivedEntry:
        return ArchivedEntry(0, "raw", f"{ms}-0", {b"run": run.encode(), b"seq": str(seq).encode(), b"ts": str(ms).encode(),
                                                  b"line": b"{}"})

    _, store = file_store(settings, tmp_path / "archive")
    for seg in ([entry(day - 12 * hour, 0), entry(day - 11 * hour, 0, run="other")], [entry(day + hour, 1)]):
        store.put(raw_segment_key("raw", 0, seg[0].id, seg[-1].id), encode_raw_segment(seg))
    live = [reader.Located("raw", 0, f"{day + hour}-0", {b"run": b"edge", b"seq": b"1"}),  # the overlap
            reader.Located("raw", 0, f"{day + 3 * hour}-0", {b"run": b"edge", b"seq": b"2"})]
    got = reader.read_log(store, live, Window(day, day + 2 * hour))
    assert got.runs == {"edge"} and not got.corrupt and got.segments == 2
    assert [(e.sid, e.fields[b"seq"]) for e in got.log()] == [
        (f"{day - 12 * hour}-0", b"0"), (f"{day + hour}-0", b"1"), (f"{day + 3 * hour}-0", b"2")]
