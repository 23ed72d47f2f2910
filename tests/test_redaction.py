"""Redactor: rule corpus, idempotence (hypothesis), event walking, configuration, form secrets."""

from __future__ import annotations

import copy
import json
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.redaction import BUILTIN_RULE_NAMES, ENVELOPE_FIELDS, Redactor, SecretFieldTracker

CORPUS = json.loads((Path(__file__).parent / "data" / "redaction_corpus.json").read_text("utf-8"))["cases"]
R = Redactor()


# --- corpus ------------------------------------------------------------------------------------


def test_corpus_covers_every_rule_with_positive_and_negative_cases():
    kinds = {(c["rule"], c["kind"]) for c in CORPUS}
    for name in BUILTIN_RULE_NAMES:
        assert (name, "positive") in kinds, name
        assert (name, "negative") in kinds, name


@pytest.mark.parametrize("case", CORPUS, ids=[f"{c['rule']}-{c['kind']}-{i}" for i, c in enumerate(CORPUS)])
def test_corpus_case(case):
    out, counts = R.redact_text(case["text"])
    assert out == case["expected"]
    assert dict(counts) == case["counts"]
    if case["kind"] == "positive":
        assert counts[case["rule"]] >= 1
        assert f"[REDACTED:{case['rule']}]" in out
    else:
        assert counts[case["rule"]] == 0
        assert out == case["text"]


def test_contextual_rules_keep_the_context():
    out, _ = R.redact_text("postgres://admin:hunter22@db.internal:5432/app")
    assert out == "postgres://admin:[REDACTED:basic-auth-url]@db.internal:5432/app"
    out, _ = R.redact_text("Authorization: Bearer abcdefghijklmnopqrstuvwx")
    assert out == "Authorization: Bearer [REDACTED:bearer]"
    out, _ = R.redact_text('{"password": "hunter22", "max_tokens": 4096}')
    assert out == '{"password": "[REDACTED:password-assignment]", "max_tokens": 4096}'
    # JSON text inside a string (escaped quotes), e.g. a log message that is itself JSON text
    out, _ = R.redact_text('{\\"password\\": \\"hunter22\\"}')
    assert out == '{\\"password\\": \\"[REDACTED:password-assignment]\\"}'


def test_most_specific_rule_wins_and_counts_add_up():
    text = "token=ghp_" + "a1B2c3D4e5" * 4 + " and AKIAIOSFODNN7EXAMPLE and AKIAIOSFODNN7EXAMPLF"
    out, counts = R.redact_text(text)
    assert out == "token=[REDACTED:github-token] and [REDACTED:aws-access-key-id] and [REDACTED:aws-access-key-id]"
    assert counts == Counter({"github-token": 1, "aws-access-key-id": 2})


def test_multiline_private_key_block_is_one_redaction():
    key = "-----BEGIN EC PRIVATE KEY-----\n" + "MHcCAQEEIIrYSSNQFaA2Hwf1duRSxKtLYX5CB04fSeQ6tF1aY/PuoAoGCCqGSM49\n" * 5
    key += "-----END EC PRIVATE KEY-----"
    out, counts = R.redact_text(f"before\n{key}\nafter")
    assert out == "before\n[REDACTED:private-key]\nafter"
    assert counts == Counter({"private-key": 1})


def test_clean_string_is_returned_as_is():
    s = "I'll start by looking at the project layout; max_tokens=4096 is fine."
    out, counts = R.redact_text(s)
    assert out is s and not counts


# --- idempotence -------------------------------------------------------------------------------

_FRAGMENTS = [c["text"] for c in CORPUS] + [
    "[REDACTED:jwt]", "[REDACTED:", "]", "password=", "token: ", '"password": "', "Bearer ", "://", "@",
    "AKIA", "sk-", "sk-ant-", "eyJ", ".", "-----BEGIN RSA PRIVATE KEY-----\n", "-----END RSA PRIVATE KEY-----",
    "ghp_", "xoxb-", "hooks.slack.com/services/", "_live_", "\n", " ", '"', "'", "=", ":", "\\",
]
_text = st.lists(
    st.one_of(st.sampled_from(_FRAGMENTS), st.text(min_size=0, max_size=30),
              st.text(alphabet="aAkKIiSs0189-_.=:/@[]REDACT ", max_size=40)),
    max_size=8,
).map("".join)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_text)
def test_redaction_is_idempotent(text):
    once, _ = R.redact_text(text)
    twice, counts2 = R.redact_text(once)
    assert twice == once
    assert sum(counts2.values()) == 0


_json_leaf = st.one_of(st.none(), st.booleans(), st.integers(), _text)
_json = st.recursive(
    _json_leaf,
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(st.text(max_size=8), children, max_size=4)),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_json, st.lists(st.text(min_size=1, max_size=6), max_size=3))
def test_event_redaction_is_idempotent_and_pure(raw, secrets):
    event = {"eventId": "r:0", "runId": "r", "seq": 0, "type": "unknown", "timestamp": "2026-09-26T14:02:13.000Z",
             "lines": [0, 0], "raw": raw}
    before = copy.deepcopy(event)
    once, c1 = R.redact_event(event, secrets)
    assert event == before  # input not mutated
    if not c1:
        assert once is event
    twice, c2 = R.redact_event(once, secrets)
    assert twice == once and sum(c2.values()) == 0


# --- events ------------------------------------------------------------------------------------


def _event(**kw):
    base = {"eventId": "laptop/20260926_3:7", "runId": "laptop/20260926_3", "seq": 7, "type": "command",
            "timestamp": "2026-09-26T14:02:13.000Z", "lines": [12, 13], "tool": "shell",
            "toolCallId": "toolu_01SCX2m1rKCtOylURFQz52vy"}
    base.update(kw)
    return base


def test_redact_event_walks_nested_values_but_not_the_envelope():
    secret = "ghp_" + "a1B2c3D4e5" * 4
    ev = _event(
        command=f"git push https://{secret}@github.com/acme/x",
        runId=f"password=hunter22-{secret}",  # envelope: never touched, even if it looks secret
        tool="password=hunter22",
        raw={"nested": [{"text": "export API_KEY=abcd1234efgh"}, 42, None, True], "type": "password=hunter22"},
    )
    before = copy.deepcopy(ev)
    out, counts = R.redact_event(ev)
    assert ev == before
    assert out is not ev
    assert out["command"] == "git push https://[REDACTED:github-token]@github.com/acme/x"
    assert out["raw"]["nested"][0]["text"] == "export API_KEY=[REDACTED:password-assignment]"
    assert out["raw"]["nested"][1:] == [42, None, True]
    assert out["raw"]["type"] == "password=[REDACTED:password-assignment]"  # nested `type` is content
    for f in ENVELOPE_FIELDS:
        assert out[f] == ev[f]
    assert counts == Counter({"github-token": 1, "password-assignment": 2})


def test_redact_event_returns_the_same_object_when_clean():
    ev = _event(command="python3 -m pytest -q tests", raw={"x": ["max_tokens=4096"]})
    out, counts = R.redact_event(ev)
    assert out is ev and not counts


def test_redact_event_shares_nothing_it_changed():
    ev = _event(raw={"a": {"b": "password=hunter22"}, "c": {"d": "clean"}})
    out, _ = R.redact_event(ev)
    assert out["raw"] is not ev["raw"] and out["raw"]["a"] is not ev["raw"]["a"]
    assert ev["raw"]["a"]["b"] == "password=hunter22"
    assert out["raw"]["c"] is ev["raw"]["c"]  # unchanged subtrees are shared


# --- configuration -----------------------------------------------------------------------------


def test_rule_names_are_bounded_and_stable():
    assert R.rule_names == BUILTIN_RULE_NAMES + ("form-secret",)
    assert set(BUILTIN_RULE_NAMES) == {
        "aws-access-key-id", "aws-secret-access-key", "gcp-api-key", "github-token", "gitlab-token", "slack-token",
        "slack-webhook", "stripe-key", "openai-key", "anthropic-key", "jwt", "private-key", "bearer",
        "basic-auth-url", "password-assignment",
    }


def test_extra_rules_and_disabled():
    r = Redactor(extra_rules={"employee-id": r"\bEMP-\d{6}\b", "ticket-pin": r"pin (?P<secret>\d{4})"},
                 disabled=["jwt"])
    assert "employee-id" in r.rule_names and "ticket-pin" in r.rule_names and "jwt" not in r.rule_names
    out, counts = r.redact_text("EMP-123456 has pin 1234; EMP-12345 does not")
    assert out == "[REDACTED:employee-id] has pin [REDACTED:ticket-pin]; EMP-12345 does not"
    assert counts == Counter({"employee-id": 1, "ticket-pin": 1})
    jwt = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"
    assert r.redact_text(jwt) == (jwt, Counter())
    # an extra rule never eats markers (idempotence holds for extra rules too)
    r2 = Redactor(extra_rules={"word": r"REDACTED|jwt"})
    once, _ = r2.redact_text("a REDACTED b " + jwt)
    assert once == "a [REDACTED:word] b [REDACTED:jwt]"
    assert r2.redact_text(once) == (once, Counter())


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"disabled": ["nope"]}, "unknown redaction rule(s) to disable: nope"),
        ({"extra_rules": {"Bad_Name": "x"}}, "must match [a-z0-9-]+"),
        ({"extra_rules": {"ok-name": "("}}, "invalid regex"),
        ({"extra_rules": {"jwt": "x"}}, "clashes with a built-in rule"),
        ({"extra_rules": {"form-secret": "x"}}, "reserved"),
    ],
)
def test_bad_configuration_is_a_clear_value_error(kwargs, message):
    with pytest.raises(ValueError) as exc:
        Redactor(**kwargs)
    assert message in str(exc.value)


def test_disabled_builtin_can_be_replaced_by_an_extra_rule():
    r = Redactor(extra_rules={"jwt": r"eyJ\S+"}, disabled=["jwt"])
    assert r.redact_text("x eyJabc y")[0] == "x [REDACTED:jwt] y"


# --- secret form answers -----------------------------------------------------------------------

ELICIT = {
    "type": "actionRequired",
    "data": {
        "actionType": "elicitation", "id": "elic-1", "message": "Database credentials",
        "requested_schema": {"type": "object", "properties": {
            "user": {"type": "string"},
            "pw": {"type": "string", "format": "password"},
            "pin": {"type": "integer", "writeOnly": True},
        }},
    },
}
RESPONSE = {"type": "actionRequired", "data": {
    "actionType": "elicitationResponse", "id": "elic-1",
    "user_data": {"user": "bob", "pw": "hunter2", "pin": 4711}, "action": "accept"}}


def test_tracker_records_secret_fields_and_values():
    t = SecretFieldTracker()
    assert t.observe({"type": "message", "message": {"content": [ELICIT]}})
    assert t.secret_fields() == {"elic-1": ("pw", "pin")}
    assert t.secret_values() == ()
    assert t.observe({"content": [RESPONSE]})
    assert t.secret_values() == ("hunter2", "4711")
    assert not t.observe({"content": [RESPONSE]})  # nothing new
    assert "hunter2" not in repr(t)


def test_tracker_ignores_untracked_and_non_secret_fields():
    t = SecretFieldTracker()
    t.observe(ELICIT)
    other = copy.deepcopy(RESPONSE)
    other["data"]["id"] = "elic-2"
    t.observe(other)
    assert t.secret_values() == ()
    plain = copy.deepcopy(ELICIT)
    plain["data"]["id"] = "elic-3"
    plain["data"]["requested_schema"]["properties"] = {"name": {"type": "string"}}
    t.observe(plain)
    assert "elic-3" not in t.secret_fields()


def test_tracker_request_and_response_in_one_object_and_roundtrip():
    t = SecretFieldTracker()
    t.observe([RESPONSE, ELICIT])  # response first in document order: requests are collected first
    assert t.secret_values() == ("hunter2", "4711")
    state = json.loads(json.dumps(t.to_dict()))
    t2 = SecretFieldTracker.from_dict(state)
    assert t2 == t and t2.secret_values() == t.secret_values() and t2.secret_fields() == t.secret_fields()
    with pytest.raises(ValueError):
        SecretFieldTracker.from_dict({"version": 99})


def test_redact_event_with_tracker_redacts_response_fields_and_values_everywhere():
    t = SecretFieldTracker()
    t.observe(ELICIT)
    t.observe(RESPONSE)
    ev = _event(type="unknown", raw=RESPONSE)
    out, counts = R.redact_event(ev, tracker=t)
    data = out["raw"]["data"]["user_data"]
    assert data == {"user": "bob", "pw": "[REDACTED:form-secret]", "pin": "[REDACTED:form-secret]"}
    assert RESPONSE["data"]["user_data"]["pw"] == "hunter2"  # not mutated
    assert counts["form-secret"] == 2
    # the value anywhere else, in a later event
    ev2 = _event(command="mysql -u bob -phunter2 -e 'select 1' # pin 4711")
    out2, counts2 = R.redact_event(ev2, tracker=t)
    assert out2["command"] == "mysql -u bob -p[REDACTED:form-secret] -e 'select 1' # pin [REDACTED:form-secret]"
    assert counts2 == Counter({"form-secret": 2})
    # explicit values work without a tracker; idempotent
    out3, _ = R.redact_event(ev2, ["hunter2"])
    assert "hunter2" not in out3["command"]
    assert R.redact_event(out3, ["hunter2"])[1] == Counter()


def test_form_secret_wins_over_rules_and_never_touches_markers():
    out, n = R.redact_secret_values("password=hunter2 [REDACTED:jwt] RED", ["hunter2", "RED", "jwt"])
    assert out == "password=[REDACTED:form-secret] [REDACTED:jwt] [REDACTED:form-secret]"
    assert n == 2
    ev = _event(command="login password=hunter22")
    out_ev, counts = R.redact_event(ev, ["hunter22"])
    assert out_ev["command"] == "login password=[REDACTED:form-secret]"
    assert counts == Counter({"form-secret": 1})


def test_longer_secret_value_wins_over_its_prefix():
    out, n = R.redact_secret_values("abc abcdef", ["abc", "abcdef"])
    assert out == "[REDACTED:form-secret] [REDACTED:form-secret]" and n == 2
