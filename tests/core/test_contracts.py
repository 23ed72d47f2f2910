"""The checked-in generated contract documents are current, and the models say what the spec says."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from contracts import EVENT_TYPES, RawEntry, harness_event_adapter, run_record_adapter
from contracts.events import ERROR_CLASSES
from contracts.generate import HERE, documents
from tests.support.fixtures import REPO


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


# ------------------------------------------------------------------ contract 1.1: error classes
CONTRACT_VERSION = "1.1.0"  # docs/contract.md, "Error classes (contract 1.1)": errorClass added


def test_the_contract_version_is_1_1_0_in_the_document_and_in_the_docs():
    checked_in = json.loads((HERE / "asyncapi.json").read_text())
    assert checked_in["info"]["version"] == CONTRACT_VERSION
    assert json.loads(documents()["asyncapi.json"])["info"]["version"] == CONTRACT_VERSION
    docs = (REPO / "docs" / "contract.md").read_text()
    assert "## Error classes (contract 1.1)" in docs and f"AsyncAPI `info.version` is\n{CONTRACT_VERSION}" in docs


@pytest.mark.parametrize("where", ["asyncapi.json", "schemas/harness-event.schema.json"])
def test_error_class_is_an_optional_closed_field_of_the_error_event_schema(where):
    doc = json.loads((HERE / where).read_text())
    defs = doc["components"]["schemas"] if where == "asyncapi.json" else doc["$defs"]
    for name in ("ErrorEvent", "WarningEvent"):  # errors, and the warnings that are retries of a cause
        schema = defs[name]
        assert schema["properties"]["errorClass"]["enum"] == list(ERROR_CLASSES), name
        assert schema["properties"]["errorClass"]["type"] == "string"
        # optional: events published before 1.1 stay valid, ids unchanged
        assert "errorClass" not in schema["required"], name


def test_error_events_with_and_without_a_class_validate_and_an_unknown_class_is_refused():
    error = {**ENVELOPE, "type": "error", "message": "Rate limit exceeded: 429"}
    harness_event_adapter.validate_python(error)  # a 1.0 event
    harness_event_adapter.validate_python({**error, "errorClass": "rate_limit"})
    with pytest.raises(ValidationError):
        harness_event_adapter.validate_python({**error, "errorClass": "rate-limited"})
