"""Redactor: rule corpus, structural redaction, families anywhere in an event (hypothesis),
prefilter equivalence, idempotence, any JSON value, key blocks over lines, configuration, form
secrets."""

from __future__ import annotations

import copy
import json
import string
import zlib
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from services.redaction import (
    BUILTIN_RULE_NAMES,
    IDENTITY_FIELDS,
    STRUCTURAL_RULE_NAMES,
    Redactor,
    SecretFieldTracker,
    is_secret_key,
)
from services.redaction.rules import (
    BUILTIN_RULES,
    github_checksum_ok,
    jwt_header_ok,
    pattern_min_chars,
    secret_key_kind,
)
from tests.support.scaling import assert_scales_linearly

_DATA = json.loads((Path(__file__).resolve().parents[1] / "data" / "redaction_corpus.json").read_text("utf-8"))
CORPUS = _DATA["cases"]
EVENT_CORPUS = _DATA["event_cases"]
R = Redactor()


# --- corpus ------------------------------------------------------------------------------------


def test_corpus_covers_every_rule_with_positive_and_negative_cases():
    kinds = {(c["rule"], c["kind"]) for c in CORPUS} | {(c["rule"], c["kind"]) for c in EVENT_CORPUS}
    for name in BUILTIN_RULE_NAMES + STRUCTURAL_RULE_NAMES:
        assert (name, "positive") in kinds, name
        assert (name, "negative") in kinds, name


# Every vendor-token family: a token right after a letter (`acme<token>`, `X<token>`) is one of its
# positive cases (issue 22); test_corpus_case runs each.
GLUED_FAMILIES = ("anthropic-key", "aws-access-key-id", "gcp-api-key", "github-token", "gitlab-token", "jwt",
                  "openai-key", "slack-token", "stripe-key")


@pytest.mark.parametrize("rule", GLUED_FAMILIES)
def test_corpus_has_the_token_glued_to_letters(rule):
    before = {c["expected"].split("[REDACTED:", 1)[0] for c in CORPUS if c["rule"] == rule and c["kind"] == "positive"}
    assert {"acme", "X"} <= before, (rule, before)


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
    # the reference path (no prefilter) agrees
    assert R.redact_text_full(case["text"]) == (out, counts)


@pytest.mark.parametrize("case", EVENT_CORPUS, ids=[f"{c['rule']}-{c['kind']}-{i}" for i, c in enumerate(EVENT_CORPUS)])
def test_event_corpus_case(case):
    event = case["event"]
    before = copy.deepcopy(event)
    out, counts = R.redact_event(event)
    assert event == before
    assert out == case["expected"]
    assert dict(counts) == case["counts"]
    marker = f"[REDACTED:{case['rule']}]"
    if case["kind"] == "positive" and case["rule"] in BUILTIN_RULE_NAMES + STRUCTURAL_RULE_NAMES:
        assert marker in orjson.dumps(out).decode()
    if case["kind"] == "negative" and case["rule"] in STRUCTURAL_RULE_NAMES:
        assert counts[case["rule"]] == 0
    for f in IDENTITY_FIELDS:
        assert out.get(f) == event.get(f)
    assert R.redact_event(out) == (out, Counter())  # idempotent


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


@pytest.mark.parametrize(
    "key, secret",
    [("password", True), ("DB_PASSWORD", True), ("SecretAccessKey", True), ("_authToken", True),
     ("x-api-key", True), ("client.secret", True), ("Set-Cookie", True), ("pAssWord", True), ("auth", True),
     ("Authorization", True), ("private_key", True), ("pass", True), ("PWD", True),
     ("max_tokens", False), ("token_count", False), ("passwordless", False), ("author", False),
     ("secret_name", False), ("keyboard", False), ("access_key_id", False), ("", False), (7, False)],
)
def test_secret_key_names(key, secret):
    assert is_secret_key(key) is secret


# --- every family, anywhere in an event (property) ----------------------------------------------

_ALNUM = string.ascii_letters + string.digits
_value = st.text(alphabet=_ALNUM, min_size=16, max_size=28).filter(
    lambda v: any(c.isdigit() for c in v) and any(c.isalpha() for c in v))
_b64 = st.text(alphabet=_ALNUM + "+/", min_size=40, max_size=64).filter(lambda v: any(c.isdigit() for c in v))

# (text form with {v}, or a callable building it) -> the value must be gone after redaction
TEXT_FAMILIES = [
    "--password={v}", "--password {v}", "--token={v}", "--api-key {v}", "--client-secret '{v}'",
    "mysql -u root -p{v} acme", "mysqldump -uroot -p{v} acme", "curl -u deploy:{v} https://x.example.com",
    "curl -s --user deploy:{v} https://x.example.com", "sshpass -p {v} ssh host", "sshpass -e -p{v} ssh host",
    "docker login -u bob -p {v} ghcr.io", "redis-cli -h r -a {v} ping", "mongosh -u admin -p{v} db",
    "Authorization: Basic {v}", "authorization: token {v}", "Authorization: Bearer {v}",
    "Cookie: sid={v}; theme=dark", "Set-Cookie: sid={v}; Path=/; HttpOnly",
    "//registry.npmjs.org/:_authToken={v}", "_auth={v}", "machine h.example.com login me password {v}",
    "machine h.example.com\n  login me\n  password {v}", '"auth": "{v}"', '"SecretAccessKey": "{v}"',
    '"SessionToken": "{v}"', "pAssword={v}", "DB_PassWord: {v}", "password%3D{v}%26next%3D1",
    "q=%22token%22%3A%22{v}%22", "export DB_PASSWORD={v}", "client_secret='{v}'", "postgres://app:{v}@db:5432/x",
    "eyJhbGciOiJub25lIn0.eyJ{v}.", "eyJhbGciOiJIUzI1NiJ9.eyJ{v}.{v}",
    "-----BEGIN RSA PRIVATE KEY-----\n{v}\n{v}\n-----END RSA PRIVATE KEY-----",
    "-----BEGIN OPENSSH PRIVATE KEY-----\n{v}",
]
# structural: object keys that name a secret
SECRET_KEYS = ["password", "DB_PASSWORD", "SecretAccessKey", "SessionToken", "_authToken", "x-api-key", "auth",
               "client_secret", "Cookie", "private_key", "passphrase", "apiKey", "accessToken", "pAssWord"]
CONTENT_FIELDS = ["message", "command", "path", "query", "tool", "toolCallId", "raw", "skillName"]

_scalar = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
                    st.text(max_size=12), st.sampled_from(["max_tokens=4096", "ok", "[REDACTED:jwt]", "https://x/y"]))
_tree = st.recursive(
    _scalar,
    lambda children: st.one_of(st.lists(children, max_size=4),
                               st.dictionaries(st.text(max_size=8), children, max_size=4)),
    max_leaves=15,
)
_filler = st.text(alphabet=string.ascii_letters + " \n:=,.", max_size=20)


def _place(data: Any, tree: Any, item: Any, as_key: str | None) -> Any:
    """`tree` with `item` put at a random spot (a new list element, a new object member, or the
    whole tree); with `as_key`, `item` becomes an object key (holding `as_key`)."""
    path: list[Any] = []
    node = tree
    while isinstance(node, (dict, list)) and node and data.draw(st.booleans()):
        key = data.draw(st.sampled_from(list(node) if isinstance(node, dict) else list(range(len(node)))))
        if not isinstance(node[key], (dict, list)):
            break
        path.append(key)
        node = node[key]
    new = {item: as_key} if as_key is not None else item
    if isinstance(node, dict):
        node[data.draw(st.text(alphabet="abcdef", min_size=1, max_size=4)) + "_x"] = new
        return tree
    if isinstance(node, list):
        node.insert(data.draw(st.integers(0, len(node))), new)
        return tree
    return new if not path else tree


def _holds(value: Any, text: str, number: int | None) -> bool:
    """Whether `text` occurs in any string or key of `value`, or `number` is one of its numbers."""
    stack = [value]
    while stack:
        x = stack.pop()
        if isinstance(x, str):
            if text in x:
                return True
        elif isinstance(x, dict):
            stack.extend(x.keys())
            stack.extend(x.values())
        elif isinstance(x, (list, tuple)):
            stack.extend(x)
        elif number is not None and isinstance(x, int) and not isinstance(x, bool) and x == number:
            return True
    return False


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_a_secret_of_every_family_anywhere_in_an_event_is_gone(data):
    v = data.draw(_value)
    how = data.draw(st.sampled_from(["text", "key", "structural"]))
    if how == "structural":
        secret_key = data.draw(st.sampled_from(SECRET_KEYS))
        shape = data.draw(st.sampled_from(["string", "list", "number"]))
        if shape == "number" and secret_key_kind(secret_key) >= 2:
            item: Any = {secret_key: int("7" + "".join(c for c in v if c.isdigit()))}
        elif shape == "list":
            item = data.draw(st.sampled_from([{secret_key: [v, "x"]}, {"env": [{"name": secret_key, "value": v}]},
                                              {"cookies": [{"name": "sid", "value": v}]}]))
        else:
            item = {secret_key: v}
    else:
        family = data.draw(st.sampled_from(TEXT_FAMILIES))
        text = family.replace("{v}", v)
        item = data.draw(_filler) + " " + text + " " + data.draw(_filler)
    field = data.draw(st.sampled_from(CONTENT_FIELDS))
    tree = data.draw(_tree) if field == "raw" else None
    if how == "key":
        value: Any = _place(data, tree if isinstance(tree, (dict, list)) else {}, item, as_key="x")
    elif field == "raw":
        value = _place(data, tree, item, None)
    elif how == "structural":
        value = item
    else:
        value = item
    event = {"eventId": "r:1", "runId": "r", "seq": 1, "type": data.draw(st.sampled_from(["unknown", "command", "agent"])),
             "timestamp": "2026-09-26T14:02:13.000Z", "lines": [1, 2], field: value}
    if data.draw(st.booleans()):
        event["truncated"] = True
    out, counts = R.redact_event(event)
    number = next(iter(item.values())) if how == "structural" else None
    assert not _holds(out, v, number if isinstance(number, int) else None), (event, out)
    assert sum(counts.values()) >= 1
    again, counts2 = R.redact_event(out)
    assert again == out and not counts2


# --- vendor tokens glued to a word (issue 22) ------------------------------------------------------

_B62 = string.digits + string.ascii_uppercase + string.ascii_lowercase


def _github_classic(prefix: str, random30: str) -> str:
    """A classic GitHub token with the CRC32 of its random part in 6 base62 digits."""
    n, digits = zlib.crc32(random30.encode()), ""
    for _ in range(6):
        n, r = divmod(n, 62)
        digits = _B62[r] + digits
    return f"{prefix}_{random30}{digits}"


_an = st.text(alphabet=_ALNUM, min_size=1, max_size=1)
_b64url = _ALNUM + "_-"
_base32 = string.ascii_uppercase + "234567"


def _tokens() -> st.SearchStrategy[tuple[str, str, str]]:
    """(rule, token, its random part) of every vendor family, with the structure each vendor gives
    its tokens (the random part is what must not survive)."""
    def text(alphabet: str, n: int) -> st.SearchStrategy[str]:
        return st.text(alphabet=alphabet, min_size=n, max_size=n)

    mixed = st.tuples(text(_ALNUM, 21), st.sampled_from(["Ab1", "x9Z", "7qQ"])).map(lambda t: t[1] + t[0])
    return st.one_of(
        st.tuples(st.sampled_from(["ghp", "gho", "ghu", "ghs", "ghr"]), text(_ALNUM, 30)).map(
            lambda t: ("github-token", _github_classic(*t), t[1])),
        st.tuples(text(_ALNUM, 22), text(_ALNUM, 59)).map(
            lambda t: ("github-token", f"github_pat_{t[0]}_{t[1]}", t[1])),
        text(_ALNUM, 20).map(lambda v: ("gitlab-token", "glpat-" + v, v)),
        st.tuples(st.sampled_from("abp"), st.integers(1, 10**12), text(_ALNUM, 24)).map(
            lambda t: ("slack-token", f"xox{t[0]}-{t[1]}-{t[1] + 7}-{t[2]}", t[2])),
        st.tuples(st.sampled_from("sr"), mixed).map(lambda t: ("stripe-key", f"{t[0]}k_live_{t[1]}", t[1])),
        text(_b64url, 40).map(lambda v: ("anthropic-key", f"sk-ant-api03-{v}AA", v)),
        st.tuples(st.sampled_from(["sk-", "sk-proj-", "sk-svcacct-"]), text(_ALNUM, 20), text(_ALNUM, 20)).map(
            lambda t: ("openai-key", f"{t[0]}{t[1]}T3BlbkFJ{t[2]}", t[1] + "T3BlbkFJ" + t[2])),
        text(_b64url, 35).map(lambda v: ("gcp-api-key", "AIza" + v, v)),
        st.tuples(text(_ALNUM, 16), text(_b64url, 32)).map(
            lambda t: ("jwt", f"eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ{t[0]}.{t[1]}", t[1])),
        st.tuples(st.sampled_from(["AKIA", "ASIA"]), text(_base32, 15)).map(
            lambda t: ("aws-access-key-id", f"{t[0]}{t[1]}7", t[1] + "7")),
    )


# what a token is glued to: `_`, a letter, a digit, `__` (goose's `<extension>__<tool>`), and
# Codex/Claude Code's `mcp__<server>__<tool>`
GLUES = ["_", "PROD_", "a", "acme", "Z", "1", "key9", "__", "acme__", "mcp__acme__", "mcp__srv__x__"]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_tokens(), st.sampled_from(GLUES), st.sampled_from(["", "__search", "_", " done", ".", "__"]))
def test_a_vendor_token_glued_to_a_word_is_redacted(token, glue, after):
    rule, tok, secret = token
    text = glue + tok + after
    out, counts = R.redact_text(text)
    assert secret not in out, (text, out)
    assert out.startswith(glue + f"[REDACTED:{rule}]"), (text, out)
    assert counts[rule] == 1
    assert R.redact_text_full(text) == (out, counts)


@pytest.mark.parametrize("glue", GLUES)
def test_the_issue_examples_glued_to_a_word(glue):
    token = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"  # no valid checksum: a test value
    if glue[-1:].isalnum():
        token = _github_classic("ghp", "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5")  # glued to a letter: the CRC must hold
    out, _ = R.redact_text(f"{glue}{token}")
    assert out == f"{glue}[REDACTED:github-token]"
    out, _ = R.redact_text(f"x{glue}AKIAIOSFODNN7EXAMPLE")
    assert out == f"x{glue}[REDACTED:aws-access-key-id]"


NEAR_MISSES = [
    "task_id", "skeleton", "mask-anything", "ghost_", "ghost_A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8", "sk-", "ghp_",
    "mask-anything-goes-here-in-2024-release", "flask-sqlalchemy-2024-migration-scripts", "whisk-2024-01-02-batch-77",
    "flask-ant-design-system-components-v2", "desk_live_backupfolder2024", "linuxoxb-build-artifacts-nightly",
    "laughs_A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8", "highs_ThisIsAVeryLongCamelCaseIdentifier42x",
    "FANTASIAMOVIECOLLECTIONS", "THEASIAPACIFICREGIONSALES", "dataeyJub3RqdXN0YWhlYWRlcg.payloadpart.signaturepart",
    "acme__ghp_short1234", "acme__glpat-short", "mcp__github__create_pull_request", "developer__shell",
    "mcp__sk-tools__search", "AIza_prefix_only", "xoxb-", "sk_live_", "eyJ", "max_tokens=4096",
]


@pytest.mark.parametrize("text", NEAR_MISSES)
def test_identifiers_that_merely_start_like_a_prefix_stay(text):
    for t in (text, f"acme__{text}", f"run {text} now"):
        assert R.redact_text(t) == (t, Counter()), t
        assert R.redact_text_full(t) == (t, Counter()), t


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["ghp", "gho", "ghs", "ghu", "ghr"]), st.text(alphabet=_ALNUM, min_size=30, max_size=30),
       st.sampled_from(["laughs", "x", "Z9"]))
def test_a_github_token_glued_to_a_letter_counts_by_its_checksum(prefix, random30, word):
    good = _github_classic(prefix, random30)
    assert github_checksum_ok(good)
    assert R.redact_text(word + good)[0] == word + "[REDACTED:github-token]"
    bad = good[:-1] + ("A" if good[-1] != "A" else "B")
    assert not github_checksum_ok(bad)
    assert R.redact_text(word + bad) == (word + bad, Counter())
    # after `_`, `-`, a blank or nothing, the shape suffices
    for glue in ("_", "__", "-", " ", ""):
        assert R.redact_text(glue + bad)[0] == glue + "[REDACTED:github-token]"


def test_a_jwt_glued_to_a_word_needs_a_json_header():
    jwt = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"
    assert jwt_header_ok(jwt.split(".")[0])
    assert not jwt_header_ok("eyJub3RqdXN0YWhlYWRlcg") and not jwt_header_ok("eyJ!!") and not jwt_header_ok("eyJ" * 2000)
    assert R.redact_text("id_token" + jwt)[0] == "id_token[REDACTED:jwt]"
    fake = "eyJub3RqdXN0YWhlYWRlcg.payloadpart.signaturepart"
    assert R.redact_text("data" + fake)[0] == "data" + fake
    assert R.redact_text("data " + fake)[0] == "data [REDACTED:jwt]"  # at a boundary the shape suffices


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_a_glued_vendor_token_hidden_anywhere_in_an_event_is_gone(data):
    rule, tok, secret = data.draw(_tokens())
    glue = data.draw(st.sampled_from(GLUES))
    item = glue + tok
    field = data.draw(st.sampled_from(CONTENT_FIELDS))
    how = data.draw(st.sampled_from(["value", "key", "text"]))
    if how == "text":
        filler = data.draw(_filler)
        assume(secret not in filler)  # the text around it may not hold the secret by chance
        item = filler + " " + item + data.draw(st.sampled_from(["", " ", "__run", "\n"]))
    tree = data.draw(_tree) if field == "raw" else None
    assume(not _holds(tree, secret, None))
    if how == "key":
        value: Any = _place(data, tree if isinstance(tree, (dict, list)) else {}, item, as_key="x")
    elif field == "raw":
        value = _place(data, tree, item, None)
    else:
        value = item
    event = {"eventId": "r:1", "runId": "r", "seq": 1, "type": data.draw(st.sampled_from(["unknown", "mcp", "command"])),
             "timestamp": "2026-09-26T14:02:13.000Z", "lines": [1, 2], field: value}
    out, counts = R.redact_event(event)
    assert not _holds(out, secret, None), (event, out)
    assert counts[rule] >= 1
    assert R.redact_event(out) == (out, Counter())


# --- prefilter ---------------------------------------------------------------------------------

_FRAGMENTS = [c["text"] for c in CORPUS] + [
    "[REDACTED:jwt]", "[REDACTED:", "]", "password=", "token: ", '"password": "', "Bearer ", "://", "@",
    "AKIA", "sk-", "sk-ant-", "eyJ", ".", "-----BEGIN RSA PRIVATE KEY-----\n", "-----END RSA PRIVATE KEY-----",
    "ghp_", "xoxb-", "hooks.slack.com/services/", "_live_", "\n", " ", '"', "'", "=", ":", "\\", "%3D", "%22",
    "curl -u ", "mysql -p", "sshpass -p ", "--token ", "Cookie: ", "Authorization: Basic ", "machine ",
    " password ", "_auth", "pAsSwOrD", "acme__", "mcp__srv__", "_", "x", "1", "T3BlbkFJ", "sk-proj-", "sk-ant-api03-",
    "mask-", "xoxb-1-", "glpat-", "AIza", "sk_live_", "ASIA", "eyJhbGciOiJIUzI1NiJ9.", "github_pat_",
]
_text = st.lists(
    st.one_of(st.sampled_from(_FRAGMENTS), st.text(min_size=0, max_size=30),
              st.text(alphabet="aAkKIiSs0189-_.=:/@[]REDACT %", max_size=40)),
    max_size=8,
).map("".join)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_text)
def test_prefilter_is_equivalent_to_the_full_path(text):
    # short strings, and long ones (which find their rules another way)
    for t in (text, "pad " * 600 + text + " end"):
        fast = R.redact_text(t)
        full = R.redact_text_full(t)
        assert fast == full
        if not R.could_match(t):
            assert full == (t, Counter())


def test_prefilter_bound_comes_from_the_patterns():
    # the shortest match: a flag after its command ("bcp -Px"), or "pwd=abcd"
    assert R.min_match_chars == min(pattern_min_chars(r.pattern) + r.context_chars for r in BUILTIN_RULES) >= 7
    assert Redactor(extra_rules={"one": "Q"}).min_match_chars == 1
    short = Redactor(extra_rules={"one": "Q"})
    assert short.redact_text("Q")[0] == "[REDACTED:one]"
    assert not R.could_match("pw=abc") and R.redact_text_full("pw=abc") == ("pw=abc", Counter())


# --- idempotence -------------------------------------------------------------------------------


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
    lambda children: st.one_of(st.lists(children, max_size=4),
                               st.dictionaries(st.one_of(st.text(max_size=8), st.sampled_from(SECRET_KEYS), _text),
                                               children, max_size=4)),
    max_leaves=12,
)


def test_a_key_the_rules_turn_into_a_secret_name_hides_its_value_on_the_first_pass():
    """Found by the idempotence property in a full run: the key's JWT is redacted, and what remains
    names a private key, so the value is a secret field at once, not only on a second pass."""
    jwt = ("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0."
           "dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U")
    event = {"eventId": "r:0", "runId": "r", "seq": 0, "type": "unknown", "timestamp": "2026-01-01T00:00:00.000Z",
             "lines": [1, 1], "raw": {f"PROD_{jwt}-----END RSA PRIVATE KEY-----":
                                      "ANTHROPIC_API_KEY=sk-ant-api03-AbCdEf123456-GhIjKl789012_MnOp"}}
    once, _ = R.redact_event(event, [])
    twice, counts = R.redact_event(once, [])
    assert list(once["raw"].values()) == ["[REDACTED:secret-field]"]
    assert jwt not in orjson.dumps(once).decode()
    assert twice == once and sum(counts.values()) == 0


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_json, st.lists(st.text(min_size=1, max_size=6), max_size=3), st.booleans())
def test_event_redaction_is_idempotent_and_pure(raw, secrets, truncated):
    event = {"eventId": "r:0", "runId": "r", "seq": 0, "type": "unknown", "timestamp": "2026-09-26T14:02:13.000Z",
             "lines": [0, 0], "raw": raw, "message": raw if isinstance(raw, str) else "x"}
    if truncated:
        event["truncated"] = True
    before = copy.deepcopy(event)
    once, c1 = R.redact_event(event, secrets)
    assert event == before  # input not mutated
    if not c1:
        assert once is event
    twice, c2 = R.redact_event(once, secrets)
    assert twice == once and sum(c2.values()) == 0


# --- any JSON value ------------------------------------------------------------------------------


def _event(**kw):
    base = {"eventId": "laptop/20260926_3:7", "runId": "laptop/20260926_3", "seq": 7, "type": "command",
            "timestamp": "2026-09-26T14:02:13.000Z", "lines": [12, 13], "tool": "shell",
            "toolCallId": "toolu_01SCX2m1rKCtOylURFQz52vy"}
    base.update(kw)
    return base


@pytest.mark.parametrize("depth", [600, 5000])
def test_any_depth_is_walked_without_recursion(depth):
    node: Any = {"password": "hunter22", "note": "export API_KEY=abcd1234efgh"}
    for i in range(depth):
        node = [node] if i % 2 else {"k": node}
    out, counts = R.redact_event(_event(type="unknown", raw=node))
    leaf = out["raw"]
    for i in reversed(range(depth)):
        leaf = leaf[0] if i % 2 else leaf["k"]
    assert leaf == {"password": "[REDACTED:secret-field]", "note": "export API_KEY=[REDACTED:password-assignment]"}
    assert counts == Counter({"secret-field": 1, "password-assignment": 1})


def test_huge_ints_non_string_keys_and_odd_values_never_raise():
    huge = 10**5000  # beyond Python's int->str limit: never converted to text
    raw = {"password": huge, "count": huge, 3: "password=hunter22", (1, 2): {"token": "abcdefgh1234"},
           None: [1.5, float("inf"), b"bytes", {"set"}], "nested": ("tuple", "sk-ant-" + "a1" * 15)}
    out, counts = R.redact_event(_event(type="unknown", raw=raw))
    assert out["raw"]["password"] == "[REDACTED:secret-field]"
    assert out["raw"]["count"] is huge
    assert out["raw"][3] == "password=[REDACTED:password-assignment]"
    assert out["raw"][(1, 2)] == {"token": "[REDACTED:secret-field]"}
    assert out["raw"][None] == raw[None]
    assert out["raw"]["nested"] == ("tuple", "[REDACTED:anthropic-key]")
    t = SecretFieldTracker()
    elicit = {"actionType": "elicitation", "id": huge, "requested_schema": {"properties": {"pw": {"format": "password"}}}}
    t.observe([elicit, {"actionType": "elicitationResponse", "id": huge, "user_data": {"pw": huge}}])
    assert t.secret_values() == ()


def test_huge_and_pathological_strings_finish():
    # regex shapes that could backtrack: many separators, many '@', many key words, no END
    texts = ["password=" * 20_000, "a@" * 50_000 + "://u:", "curl " + "-x " * 30_000, "-----BEGIN RSA PRIVATE KEY-----"
             + "A" * 200_000, "machine " * 20_000, "Cookie: " + "a=" * 50_000, "eyJ" + "a" * 100_000 + ".",
             "%3D" * 50_000 + "password%3D" + "hunter2222"]
    for text in texts:
        out, _ = R.redact_text(text)
        assert isinstance(out, str)
    assert R.redact_text(texts[-1])[0].endswith("password%3D[REDACTED:password-assignment]")


# Each run of a token's prefix as a function of its length (the long runs that once took 10-50 s).
_RUNS: dict[str, Callable[[int], str]] = {
    "eyJ": lambda n: "eyJ" * n, "sk-": lambda n: "sk-" * n, "xsk-a": lambda n: "xsk-a" * n,
    "_eyJ then a dot": lambda n: "_eyJ" * n + ".", "JWT-like chunks": lambda n: ("eyJ" * n + "aaaa.") * 7,
    "xeyJ chunks": lambda n: "xeyJaaaaaaaaaaa." * n, "sk-ant-": lambda n: "sk-ant-" * n,
    "ghp_": lambda n: "ghp_" * n, "AIza": lambda n: "AIza" * n, "xoxb-": lambda n: "xoxb-" * n,
    "AKIA": lambda n: "AKIA" * n,
}
_RUN_SIZES = {"eyJ": 35_000, "sk-": 35_000, "xsk-a": 20_000, "_eyJ then a dot": 25_000, "JWT-like chunks": 5_000,
              "xeyJ chunks": 6_000, "sk-ant-": 15_000, "ghp_": 25_000, "AIza": 25_000, "xoxb-": 20_000, "AKIA": 25_000}


def _redact_both(text: str) -> None:
    R.redact_text(text)
    R.redact_text_full(text)


@pytest.mark.parametrize("name", list(_RUNS))
def test_vendor_rules_without_a_boundary_stay_linear(name):
    # A token may now start inside a word: a start at every `eyJ`/`sk-` of a long run, each
    # scanning to the run's end, took 10-50 s on 60 KB; linear, twice the run takes about twice
    # the time (tests/support/scaling.py: a ratio, not a wall-clock bound).
    assert_scales_linearly(_redact_both, _RUNS[name], _RUN_SIZES[name])


# --- events ------------------------------------------------------------------------------------


def test_redact_event_walks_nested_values_and_content_fields_but_not_identity():
    secret = "ghp_" + "a1B2c3D4e5" * 4
    ev = _event(
        command=f"git push https://{secret}@github.com/acme/x",
        runId="laptop/AKIAIOSFODNN7EXAMPLE",  # identity: never touched (it keys the run's state)
        tool="password=hunter22",  # content: goose wrote it
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
    assert out["tool"] == "password=[REDACTED:password-assignment]"
    for f in IDENTITY_FIELDS:
        assert out[f] == ev[f]
    assert counts == Counter({"github-token": 1, "password-assignment": 3})


def test_redact_event_returns_the_same_object_when_clean():
    ev = _event(command="python3 -m pytest -q tests", raw={"x": ["max_tokens=4096"], "password_file": "/run/pw"})
    out, counts = R.redact_event(ev)
    assert out is ev and not counts


def test_redact_event_shares_nothing_it_changed():
    ev = _event(raw={"a": {"b": "password=hunter22"}, "c": {"d": "clean"}})
    out, _ = R.redact_event(ev)
    assert out["raw"] is not ev["raw"] and out["raw"]["a"] is not ev["raw"]["a"]
    assert ev["raw"]["a"]["b"] == "password=hunter22"
    assert out["raw"]["c"] is ev["raw"]["c"]  # unchanged subtrees are shared


def test_keys_that_become_equal_keep_both_values_in_order():
    raw = {"AKIAIOSFODNN7EXAMPLE": 1, "AKIAIOSFODNN7EXAMPLF": 2, "[REDACTED:aws-access-key-id] (2)": 3}
    out, counts = R.redact_event(_event(type="unknown", raw=raw))
    assert list(out["raw"].items()) == [("[REDACTED:aws-access-key-id]", 1), ("[REDACTED:aws-access-key-id] (2)", 2),
                                        ("[REDACTED:aws-access-key-id] (2) (2)", 3)]
    assert counts == Counter({"aws-access-key-id": 2})


def test_truncated_event_loses_the_fragment_the_cap_cut():
    token = "ghp_" + "a1B2c3D4e5" * 4
    cut = f"I printed it: {token}"[:30]  # the cap cut the token in half
    out, counts = R.redact_event(_event(type="agent", message=cut, truncated=True))
    assert out["message"] == "I printed it: [REDACTED:truncated-tail]"
    assert token[:10] not in out["message"] and counts == Counter({"truncated-tail": 1})
    # disabled, the rule does nothing (and its name is not a label)
    r = Redactor(disabled=["truncated-tail"])
    assert r.redact_event(_event(type="agent", message=cut, truncated=True))[0]["message"] == cut
    assert "truncated-tail" not in r.rule_names


def test_structural_redaction_can_be_disabled():
    r = Redactor(disabled=["secret-field"])
    ev = _event(type="unknown", raw={"password": "hunter2"})
    assert r.redact_event(ev) == (ev, Counter())


# --- private key blocks over several lines -------------------------------------------------------

KEY_LINES = ["-----BEGIN RSA PRIVATE KEY-----", "Proc-Type: 4,ENCRYPTED", "DEK-Info: AES-128-CBC,0123456789ABCDEF",
             "MIIEpAIBAAKCAQEA7bqZ3Jvb3Z5IGdvb3N5MIIEpAIBAAKCAQEA7bqZ3Jvb3Z5IGdv",
             "b3N5MIIEpAIBAAKCAQEA7bqZ3Jvb3Z5IGdvb3N5==", "-----END RSA PRIVATE KEY----- trailing"]


def _warning(i: int, message: str) -> dict:
    return {"eventId": f"r:{i}", "runId": "r", "seq": i, "type": "warning", "timestamp": "2026-09-26T14:02:13.000Z",
            "lines": [i, i], "message": message}


def _lines_through(lines: list[tuple[str | None, str]], tracker: SecretFieldTracker, cut: int | None = None) -> list[str]:
    """Redacts each (stream, message) as its own event; with `cut`, the tracker goes through its
    serialized form after that many lines (a commit and a reload by another worker)."""
    out = []
    for i, (stream, message) in enumerate(lines):
        if cut is not None and i == cut:
            tracker = SecretFieldTracker.from_dict(json.loads(json.dumps(tracker.to_dict())))
        ev, _ = R.redact_event(_warning(i, message), tracker=tracker, stream=stream)
        out.append(ev["message"])
    return out


@pytest.mark.parametrize("stream", ["stderr", "stdout", None])
def test_private_key_block_split_over_lines_is_redacted_until_end(stream):
    lines = [(stream, "writing key"), *[(stream, m) for m in KEY_LINES], (stream, "done: 1 key")]
    out = _lines_through(lines, SecretFieldTracker())
    assert out == ["writing key"] + ["[REDACTED:private-key]"] * 5 + ["[REDACTED:private-key] trailing", "done: 1 key"]
    # replay with the state committed and reloaded at every point gives the same lines
    for cut in range(len(lines)):
        assert _lines_through(lines, SecretFieldTracker(), cut) == out


def test_key_block_is_per_stream():
    lines = [("stderr", KEY_LINES[0]), ("stdout", "compiling module"), ("stderr", KEY_LINES[3]),
             ("stdout", "ABCDEF0123"), ("stderr", KEY_LINES[4]), ("stderr", KEY_LINES[5])]
    out = _lines_through(lines, SecretFieldTracker())
    assert out == ["[REDACTED:private-key]", "compiling module", "[REDACTED:private-key]", "ABCDEF0123",
                   "[REDACTED:private-key]", "[REDACTED:private-key] trailing"]


def test_key_block_ends_on_a_line_that_is_not_key_body_when_the_stream_is_known():
    t = SecretFieldTracker()
    out = _lines_through([("stderr", KEY_LINES[0]), ("stderr", KEY_LINES[3]), ("stderr", "error: file truncated"),
                          ("stderr", "ABCDEF0123")], t)
    assert out == ["[REDACTED:private-key]", "[REDACTED:private-key]", "error: file truncated", "ABCDEF0123"]
    assert t.key_block_lines("stderr") is None


def test_key_block_of_unknown_stream_survives_other_lines_and_is_bounded():
    t = SecretFieldTracker()
    out = _lines_through([(None, KEY_LINES[0]), (None, "compiling module"), (None, KEY_LINES[3])], t)
    assert out == ["[REDACTED:private-key]", "compiling module", "[REDACTED:private-key]"]
    for _ in range(600):
        R.redact_event(_warning(9, "QUJDREVGMDEyMw=="), tracker=t)
    assert t.key_block_lines("*") is None  # no END after hundreds of body lines: the block ended


def test_service_warnings_and_other_events_do_not_touch_the_block():
    t = SecretFieldTracker()
    R.redact_event(_warning(0, KEY_LINES[0]), tracker=t, stream="stderr")
    coded = dict(_warning(1, "ABCDEF0123"), code="missing-entries")
    assert R.redact_event(coded, tracker=t, stream="stderr")[0]["message"] == "ABCDEF0123"
    assert t.key_block_lines("stderr") == 0
    assert "keyBlocks" in t.to_dict() and "ABCDEF" not in repr(t)


# --- configuration -----------------------------------------------------------------------------


def test_rule_names_are_bounded_and_stable():
    assert R.rule_names == BUILTIN_RULE_NAMES + STRUCTURAL_RULE_NAMES + ("form-secret",)
    assert len(set(R.rule_names)) == len(R.rule_names)
    assert set(BUILTIN_RULE_NAMES) == {
        "aws-access-key-id", "aws-secret-access-key", "gcp-api-key", "github-token", "gitlab-token", "slack-token",
        "slack-webhook", "stripe-key", "openai-key", "anthropic-key", "jwt", "private-key", "bearer",
        "basic-auth-url", "password-assignment", "authorization", "cookie", "cli-password", "netrc",
    }
    assert STRUCTURAL_RULE_NAMES == ("secret-field", "truncated-tail")


def test_every_count_is_a_known_rule_name():
    texts = [c["text"] for c in CORPUS]
    names: set[str] = set()
    for t in texts:
        names |= set(R.redact_text(t)[1])
    for c in EVENT_CORPUS:
        names |= set(R.redact_event(c["event"])[1])
    assert names <= set(R.rule_names)


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
        ({"extra_rules": {"secret-field": "x"}}, "clashes with a built-in rule"),
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
    # a state written before key blocks existed still loads
    old = {"version": 1, "fields": {"elic-1": ["pw"]}, "values": ["hunter2"]}
    assert SecretFieldTracker.from_dict(old).to_dict() == old


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


# --- through the sequencer (the worker's and replay's path) -------------------------------------


def _entry(seq: int, stream: str, text: str):
    from services.sequencer import Entry

    return Entry("redact/run", seq, 1000 + seq, "line", stream, text, None, None, None, f"{seq}-0")


def _run_through(entries: list, reload_every: int | None) -> list[dict]:
    """Events of `entries` fed in the given order to a redacting RunSequencer; with
    `reload_every`, the run state goes through JSON (a commit and a load by another worker)."""
    from services.sequencer import RunSequencer

    seq_ = RunSequencer("redact/run", redactor=R)
    events: list[dict] = []
    for i, entry in enumerate(entries):
        if reload_every and i % reload_every == 0:
            seq_ = RunSequencer.from_state(orjson.loads(orjson.dumps(seq_.to_state())), redactor=R)
        events += seq_.accept(entry).events
    return events


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.randoms(use_true_random=False), st.sampled_from([None, 1, 2, 3]))
def test_key_block_over_lines_replays_alike_in_any_delivery_order(rnd, reload_every):
    lines = [("stdout", "starting"), ("stderr", KEY_LINES[0]), ("stdout", "compiling module"),
             *[("stderr", m) for m in KEY_LINES[1:]], ("stderr", "done: 1 key")]
    entries = [_entry(i, stream, text) for i, (stream, text) in enumerate(lines)]
    reference = _run_through(entries, None)
    messages = [e["message"] for e in reference]
    assert messages == ["starting", "[REDACTED:private-key]", "compiling module"] + ["[REDACTED:private-key]"] * 4 + [
        "[REDACTED:private-key] trailing", "done: 1 key"]
    shuffled = list(entries)
    rnd.shuffle(shuffled)
    assert _run_through(shuffled, reload_every) == reference


_any_json = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
              st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=40), _text),
    lambda children: st.one_of(st.lists(children, max_size=5),
                               st.dictionaries(st.one_of(st.text(max_size=10), st.sampled_from(SECRET_KEYS),
                                                         st.sampled_from(["name", "value", "Value"])),
                                               children, max_size=5)),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_any_json, st.sampled_from(["unknown", "warning", "agent", "command"]), st.booleans(), st.booleans())
def test_any_json_value_in_any_field_never_raises(value, etype, truncated, with_tracker):
    event = {"eventId": "r:0", "runId": "r", "seq": 0, "type": etype, "timestamp": "2026-09-26T14:02:13.000Z",
             "lines": [0, 0], "raw": value, "message": value, "tool": value}
    if truncated:
        event["truncated"] = True
    tracker = SecretFieldTracker() if with_tracker else None
    if tracker is not None:
        tracker.observe(value)
    out, counts = R.redact_event(event, tracker=tracker)
    assert set(counts) <= set(R.rule_names)
    assert R.redact_event(out)[1] == Counter() or with_tracker  # idempotent (a tracker may add form values)
    if tracker is not None:
        assert SecretFieldTracker.from_dict(json.loads(json.dumps(tracker.to_dict()))) == tracker
