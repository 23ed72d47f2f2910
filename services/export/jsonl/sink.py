"""The JSON-lines target: every topic entry once as one line of `<dir>/<day>/<stream>.jsonl`.

The day is the UTC day of the entry's stream id (when Redis took it), not of the write: a
redelivered entry always lands in the same file, whichever process writes it and when. Each line
carries its stream and entry id, and that pair is the idempotence key: before appending to a file
(under an exclusive flock, so a second instance or a reclaiming successor appends in turn) the
lines other writers added since this process last looked are read, and entries already there are
skipped. A line cut short by a killed writer (it never acknowledged, so its entries come again) is
cut off before appending. Memory: the ids of the files this process appends to (MAX_OPEN_FILES).
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import orjson

from contracts.consumers import JSONL_INVALID_ENTRY
from contracts.deadletters import DeadLetter
from contracts.stream_ids import StreamId
from contracts.topics import EVENT, RECORD, TopicEntry, TopicEntryError
from services.export.batch_sink import TargetDown
from services.streams.reader import GroupReader, StreamEntry

MAX_OPEN_FILES = 64  # files whose ids are kept between batches (today's partitions, a few late ones)


def day_of(entry_id: str) -> str:
    return datetime.fromtimestamp(StreamId.parse(entry_id).ms / 1000, UTC).strftime("%Y-%m-%d")


class JsonlFiles:
    def __init__(self, directory: Path, kinds: dict[str, str]) -> None:
        self.directory, self.kinds = directory, kinds  # kinds: stream -> EVENT / RECORD
        self.seen: dict[Path, tuple[int, set[str]]] = {}  # file -> (bytes read, entry ids in it)

    def write_batch(self, entries: Sequence[StreamEntry], reader: GroupReader) -> list[DeadLetter]:
        lines: dict[Path, list[tuple[str, bytes]]] = {}
        dead = []
        for e in entries:
            try:
                doc = TopicEntry.from_fields(e.fields, self.kinds[e.stream]).document()  # type: ignore[arg-type]
            except TopicEntryError as exc:
                dead.append(reader.dead_letter(e, JSONL_INVALID_ENTRY, str(exc)))
                continue
            line = {"stream": e.stream, "entryId": e.entry_id, "topic": "events" if self.kinds[e.stream] == EVENT
                    else "runs", "data": doc}
            path = self.directory / day_of(e.entry_id) / f"{e.stream}.jsonl"
            lines.setdefault(path, []).append((e.entry_id, orjson.dumps(line) + b"\n"))
        try:
            for path, items in lines.items():
                self._append(path, items)
        except OSError as exc:
            raise TargetDown(f"cannot write {self.directory}: {exc.strerror or type(exc).__name__}") from None
        return dead

    def _append(self, path: Path, items: list[tuple[str, bytes]]) -> None:
        path.parent.mkdir(exist_ok=True)  # the day's; never the directory itself (gone: an unmounted volume)
        with open(path, "a+b") as f:
            fcntl.flock(f, fcntl.LOCK_EX)  # released on close
            read, ids = self.seen.pop(path, (0, set()))
            size = os.fstat(f.fileno()).st_size
            if size < read:  # replaced or truncated behind our back: read it whole again
                read, ids = 0, set()
            f.seek(read)
            tail = f.read()
            complete = tail.rfind(b"\n") + 1
            if complete < len(tail):  # a killed writer's last line: its entries were never acknowledged
                f.truncate(read + complete)
            ids.update(orjson.loads(line)["entryId"] for line in tail[:complete].splitlines() if line)
            new = [(i, line) for i, line in items if i not in ids]
            f.write(b"".join(line for _, line in new))
            f.flush()
            os.fsync(f.fileno())
            ids.update(i for i, _ in new)
            self.seen[path] = (read + complete + sum(len(line) for _, line in new), ids)
            while len(self.seen) > MAX_OPEN_FILES:
                self.seen.pop(next(iter(self.seen)))

    def close(self) -> None:
        self.seen.clear()


def target(directory: Path, events: list[str], runs: list[str]) -> JsonlFiles:
    return JsonlFiles(directory, {**{s: EVENT for s in events}, **{s: RECORD for s in runs}})
