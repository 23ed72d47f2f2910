"""Procedures that drive the core (normalizer, sequencer with entry parsing, redactor) on a case
and return everything it produced as bytes.

The compiled core and the Python core are compared by running the same procedure on the same case
in two processes, one of each kind (``tests/core/test_native_core.py`` in this process,
``tests/support/pure_core.py`` beside it), and comparing the bytes. This file is test code and
never compiled: both sides run it as it is.

A case is JSON-able data (stdlib ``json`` carries lone surrogates, which agent output can hold).
"""

from __future__ import annotations

import os
import random
from typing import Any

import orjson

from services.normalizer import Limits, RunNormalizer, error_classes
from services.redaction import Redactor
from services.sequencer import Outcome, Rejected, RunSequencer, parse_batch
from services.sequencer.entries import Entry

T0 = 1_790_000_000_000


def _dumps(value: Any) -> bytes:
    try:
        return orjson.dumps(value)
    except TypeError as exc:  # same class and message on both sides, or the comparison fails
        return orjson.dumps({"unserializable": str(exc)})


def _guarded(procedure: Any, case: Any) -> bytes:
    try:
        return procedure(case)
    except Exception as exc:  # the core should never raise; if it does, both must raise alike
        if os.environ.get("CORE_CASES_RAISE"):  # to see where: the traceback instead
            raise
        return orjson.dumps({"raised": type(exc).__name__})


def normalize(case: dict[str, Any]) -> bytes:
    """A run through ``RunNormalizer``: labels, the batch call between state round trips at
    ``cuts``, the per-line call for the same items, and the end of input."""
    limits = Limits(*case["limits"])
    items = [(text, stream) for text, stream in case["items"]]
    flabel, alabel = case["labels"]
    out: dict[str, Any] = {}
    for name in ("lines", "line"):
        norm = RunNormalizer("r", limits, fmt=case["fmt"])
        events = norm.apply_labels(flabel, alabel, 0, T0)
        states = []
        cuts = sorted({c for c in case["cuts"] if 0 < c < len(items)} | {len(items)})
        start = 0
        for cut in cuts:
            piece = [(seq, T0 + seq, text, stream) for seq, (text, stream) in enumerate(items[start:cut], start)]
            if name == "lines":
                events += norm.lines(piece)
            else:
                for seq, ts, text, stream in piece:
                    events += norm.line(seq, ts, text, stream)
            state = norm.to_bytes()
            states.append(state.decode())
            norm = RunNormalizer.from_bytes(state, limits)
            start = cut
        events += norm.end(len(items), T0 + len(items), case["exit"])
        out[name] = {"events": events, "states": states, "counts": norm.counts_by_type(), "format": norm.format}
    return _dumps(out)


def _fields(rnd: random.Random, run: str, seq: int, text: str, kind: str, fmt: str | None) -> dict[bytes, bytes]:
    entry = Entry(run, seq, T0 + seq, kind, "stderr" if rnd.random() < 0.05 else "stdout", text,
                  0 if kind == "eof" else None, "h" if seq % 7 == 0 else None, "a" if seq == 3 else None,
                  f"{T0 + seq}-0", format=fmt if seq == 0 else None)
    return entry.to_fields()


def _held(sequencer: RunSequencer) -> list[Any]:
    changes = sequencer.take_held_changes()
    return [[e.to_list() for e in changes.added], list(changes.removed),
            [[key, data.decode()] for key, data in changes.calls_added], list(changes.calls_removed)]


def sequence(case: dict[str, Any]) -> bytes:
    """Raw field maps (some poisoned) -> ``parse_fields`` -> ``RunSequencer.accept_many`` in
    random batches, with state round trips, with or without a redactor."""
    rnd = random.Random(case["seed"])
    lines = list(case["lines"])
    fmt = case["fmt"]
    fields = [_fields(rnd, "r", i, text, "line", fmt) for i, text in enumerate(lines)]
    fields.append(_fields(rnd, "r", len(lines), "", "eof", None))
    stream = list(fields)
    for _ in range(int(case["disorder"] * len(stream))):  # swaps, duplicates, poisoned copies
        i, j = rnd.randrange(len(stream)), rnd.randrange(len(stream))
        roll = rnd.random()
        if roll < 0.4:
            stream[i], stream[j] = stream[j], stream[i]
        elif roll < 0.8:
            stream.insert(j, stream[i])
        else:
            bad = dict(stream[i])
            bad[rnd.choice([b"seq", b"ts", b"kind", b"exit", b"format", b"line"])] = rnd.choice(
                [b"--5", b"9" * 25, b"\xff\xfe", b"", b"eof", b"x" * 70])
            stream.insert(j, bad)
    redactor = Redactor() if case["redact"] else None
    sequencer = RunSequencer("r", redactor=redactor)
    report: list[Any] = []
    pos, k = 0, 0
    while pos < len(stream):
        size = rnd.choice([1, 2, 5, 50, 500])
        chunk, pos = stream[pos:pos + size], pos + size
        entries: list[Entry] = []
        sids = [f"{T0 + k + i}-0" for i in range(len(chunk))]
        k += len(chunk)
        for parsed in parse_batch(sids, chunk, 1_000_000):
            if isinstance(parsed, Rejected):
                report.append(["rejected", *parsed])
            else:
                entries.append(parsed)
        if rnd.random() < 0.3:  # resume from stored state, as another worker would
            sequencer = RunSequencer.from_state(orjson.loads(orjson.dumps(sequencer.to_state())), redactor=redactor)
        out = Outcome()
        sequencer.accept_many(entries, out)
        report.append({
            "events": out.events,
            "records": out.records,
            "dispositions": [[d.entry.seq, d.outcome, d.reason, d.detail] for d in out.dispositions],
            "redactions": dict(sorted(out.redactions.items())) if out.redactions else {},
            "held": _held(sequencer),
        })
    report.append(sequencer.to_state())
    return _dumps(report)


def redact(case: dict[str, Any]) -> bytes:
    """Events through ``Redactor.redact_event``, with and without form-secret values, and the
    text rules on every string of the case."""
    redactor = Redactor()
    out: list[Any] = []
    for event in case["events"]:
        for values in ((), case["secret_values"]):
            redacted, counts = redactor.redact_event(event, values)
            out.append([redacted, dict(sorted(counts.items()))])
    for text in case["texts"]:
        redacted_text, counts = redactor.redact_text(text)
        out.append([redacted_text, dict(sorted(counts.items())), redactor.redact_text_full(text)[0]])
    return _dumps(out)


def classify(case: dict[str, Any]) -> bytes:
    """Error classes of (event type, code, message) triples (services/normalizer/error_classes.py)."""
    return _dumps([[error_classes.classify(code if isinstance(code, str) else None, message if isinstance(message, str) else ""),
                    error_classes.event_class(etype, code, message)] for etype, code, message in case["items"]])


PROCEDURES = {"normalize": normalize, "sequence": sequence, "redact": redact, "classify": classify}


def run(op: str, case: Any) -> bytes:
    return _guarded(PROCEDURES[op], case)
