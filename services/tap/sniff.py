"""What an input is when it is not one record per line, from its first bytes: a compressed file, a
SQLite database (goose's sessions.db), or one multi-line JSON document (`--output-format json`).

One detection for every reader of agent output: `normalize` and `publish` refuse such input (exit 2),
a live `tap` warns once and publishes the lines anyway (the command's output is what it is). Pure and
cheap to import: the tap loads it.
"""

from __future__ import annotations

SQLITE_MAGIC = b"SQLite format 3\x00"
HEAD_BYTES = len(SQLITE_MAGIC)  # enough of the input to tell every kind below
# Compressed files (magic bytes -> the tool that opens them): their bytes decode to junk "lines".
COMPRESSED = ((b"\x1f\x8b", "gzip", "zcat"), (b"\x28\xb5\x2f\xfd", "zstd", "zstdcat"), (b"BZh", "bzip2", "bzcat"),
              (b"\xfd7zXZ\x00", "xz", "xzcat"), (b"PK\x03\x04", "zip", "unzip -p"))
# A line stream never has a line that is only an opening bracket; a pretty-printed document does.
DOCUMENT_OPENERS = ("{", "[")


def binary_kind(head: bytes, label: str, shown: str, reader: str) -> str | None:
    """What the first HEAD_BYTES say the input is (one sentence with what to do), or None for text.
    `label` names the input in the sentence ("run.jsonl.gz", "standard input"), `shown` is its name in
    the suggested command line, `reader` the command that reads stdin (`goose-ingest normalize -`)."""
    for magic, kind, tool in COMPRESSED:
        if head.startswith(magic) and not (kind == "bzip2" and not head[3:4].isdigit()):
            return f"{label} is {kind}-compressed, not stream lines: decompress it first (`{tool} {shown} | {reader}`)"
    if head.startswith(SQLITE_MAGIC):
        return (f"{label} is a SQLite database (goose's sessions.db?), not stream lines: "
                f"import it with `goose-ingest import-sessions {shown if shown != 'FILE' else 'PATH'} --namespace NS`")
    return None


def document_kind(first_line: str, label: str) -> str | None:
    """The sentence for a first non-blank line that opens a multi-line JSON document, else None."""
    if first_line.strip() in DOCUMENT_OPENERS:
        return (f"{label} looks like one multi-line JSON document (`goose run --output-format json`?), "
                "not one JSON record per line: run the agent with `--output-format stream-json` "
                "(or import goose's sessions.db with `goose-ingest import-sessions`)")
    return None


class LiveSniffer:
    """The same detection on a live stream, fed its chunks as they come: `feed` returns the sentence
    once, as soon as the first bytes (or the first non-blank line) tell, and None ever after."""

    LOOK_BYTES = 1 << 16  # no verdict on a first line longer than this: it is not a lone bracket

    def __init__(self, label: str, shown: str, reader: str, documents: bool = True) -> None:
        self.label, self.shown, self.reader, self.documents = label, shown, reader, documents
        self.done = False
        self._head = b""

    def feed(self, chunk: bytes) -> str | None:
        if self.done:
            return None
        self._head += chunk[: self.LOOK_BYTES]
        lines = self._head.split(b"\n")
        if len(self._head) < HEAD_BYTES and len(lines) == 1:
            return None  # too few bytes yet to tell
        why = binary_kind(self._head[:HEAD_BYTES], self.label, self.shown, self.reader)
        if why is None:
            for line in lines[:-1]:  # complete lines only
                text = line.decode("utf-8", "replace")
                if text.strip():
                    self.done = True
                    return document_kind(text, self.label) if self.documents else None
            if len(self._head) < self.LOOK_BYTES:
                return None
        self.done = True
        return why
