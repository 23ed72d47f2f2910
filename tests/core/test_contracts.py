"""The checked-in generated contract documents are current, and the models say what the spec says."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from contracts import EVENT_TYPES, RawEntry, harness_event_adapter, run_record_adapter
from contracts.generate import HERE, documents


@pytest.mark.parametrize("name", sorted(documents()))
def test_generated_document_is_current(name):
    path = HERE / name
    assert path.exists(), f"run `python -m contracts.generate` to create contracts/{name}"
    assert path.read_text() == documents()[name], f"contracts/{name} is stale: run `python -m contracts.generate`"


def test_schemas_never_allow_null():
    for name, text in documents().items():
        assert '"type": "null"' not in text, name
        assert '"default": null' not in text, name


def test_asyncapi_lists_every_topic():
    doc = json.loads(documents()["asyncapi.json"])
    addresses = {c["address"] for c in doc["channels"].values()}
    assert {f"harness.events.{t}" for t in EVENT_TYPES} | {"harness.events", "harness.runs", "goose.deadletter"} <= addresses


ENVELOPE = {"eventId": "r:0", "runId": "r", "seq": 0, "timestamp": "2026-01-01T00:00:00.000Z", "lines": [0, 0]}


def test_an_optional_field_may_be_omitted_but_not_null():
    harness_event_adapter.validate_python({**ENVELOPE, "type": "command", "command": "ls"})
    with pytest.raises(ValidationError):
        harness_event_adapter.validate_python({**ENVELOPE, "type": "command", "command": "ls", "exitCode": None})


@pytest.mark.parametrize(
    "event",
    [
        {**ENVELOPE, "type": "read"},  # path required
        {**ENVELOPE, "type": "read", "path": "a", "startLine": 0},  # lines are >= 1
        {**ENVELOPE, "type": "agent", "message": "x", "extra": 1},  # no unknown fields
        {**ENVELOPE, "type": "nope"},
        {**ENVELOPE, "type": "agent", "message": "x", "timestamp": "2026-01-01T00:00:00Z"},  # ms required
    ],
)
def test_invalid_events_are_rejected(event):
    with pytest.raises(ValidationError):
        harness_event_adapter.validate_python(event)


def test_raw_entry_needs_a_line_for_kind_line_and_a_valid_run_key():
    RawEntry(run="host/20261129_3", seq=0, ts=1, line="{}")
    RawEntry(run="host/20261129_3", seq=5, ts="2026-11-29T10:00:00Z", kind="eof", exit=1)
    with pytest.raises(ValidationError):
        RawEntry(run="host/1", seq=0, ts=1)
    with pytest.raises(ValidationError):
        RawEntry(run="has space", seq=0, ts=1, line="x")
    with pytest.raises(ValidationError):
        RawEntry(run="r", seq=-1, ts=1, line="x")


def test_run_records_are_a_union_on_state():
    base = {"recordId": "r:run:0", "runId": "r", "timestamp": "2026-01-01T00:00:00.000Z", "seq": 0,
            "counts": {t: 0 for t in EVENT_TYPES}}
    assert run_record_adapter.validate_python({**base, "state": "ended", "exitCode": 1}).exitCode == 1
    with pytest.raises(ValidationError):
        run_record_adapter.validate_python({**base, "state": "started", "exitCode": 1})


def test_every_example_in_the_contract_doc_is_a_valid_event():
    import re

    from tests.support.fixtures import REPO

    text = (REPO / "docs" / "contract.md").read_text()
    examples = re.findall(r"```json\n(.*?)\n```", text, re.S)
    assert len(examples) >= 11
    for example in examples:
        event = json.loads(example.replace("…", "..."))
        harness_event_adapter.validate_python(event)
