"""Pure, deterministic redaction of harness events (the raw log is never touched).

``Redactor.redact_event`` walks every string value of an event (nested dicts and lists included)
except the envelope fields, and replaces secrets with ``[REDACTED:<rule-name>]``.

Idempotence: text that already looks like a marker (``[REDACTED:<name>]``) is never matched
again, and ``redact_text`` repeats its rule pass until nothing changes (at most a few passes; only
dirty strings pay for more than one), so ``redact(redact(x)) == redact(x)`` and the second pass
reports no counts.

Secret form answers: ``SecretFieldTracker`` follows goose elicitations (``actionRequired`` with
``actionType: elicitation`` and a ``requested_schema`` whose properties are ``writeOnly: true``
or ``format: "password"``) and the matching ``elicitationResponse``; the values answered for those
fields are then redacted everywhere as ``[REDACTED:form-secret]``.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from functools import lru_cache
from typing import Any, Iterable, Iterator

from .rules import (
    BUILTIN_RULE_NAMES,
    BUILTIN_RULES,
    FORM_SECRET,
    MARKER_PREFIX,
    MARKER_RE,
    NAME_RE,
    Rule,
    marker,
)

# Envelope fields of a harness event: never redacted (ids, order, type, provenance).
ENVELOPE_FIELDS = frozenset({"eventId", "runId", "seq", "type", "timestamp", "lines", "toolCallId", "tool"})

_MAX_PASSES = 4
_FORM_MARKER = marker(FORM_SECRET)


def _marker_spans(s: str) -> list[tuple[int, int]]:
    if MARKER_PREFIX not in s:
        return []
    return [m.span() for m in MARKER_RE.finditer(s)]


def _overlaps(spans: list[tuple[int, int]], start: int, end: int) -> bool:
    for a, b in spans:
        if a < end and start < b:
            return True
        if a >= end:
            break
    return False


def _apply_rule(rule: Rule, name: str, s: str) -> tuple[str, int]:
    """One ``sub`` of one rule; matches touching an existing marker or vetoed by ``check`` stay."""
    spans = _marker_spans(s)
    n = 0
    rep = marker(name)
    group = rule.group
    check = rule.check

    def repl(m: re.Match) -> str:
        nonlocal n
        start, end = m.span(group)
        whole = m.group(0)
        if start < 0 or start == end:
            return whole
        if spans and _overlaps(spans, start, end):
            return whole
        if check is not None and not check(m):
            return whole
        n += 1
        ms, me = m.span(0)
        return s[ms:start] + rep + s[end:me]

    out = rule.pattern.sub(repl, s)
    return (out, n) if n else (s, 0)


@lru_cache(maxsize=256)
def _values_pattern(values: tuple[str, ...]) -> re.Pattern | None:
    vals = [v for v in values if isinstance(v, str) and len(v) >= 1]
    if not vals:
        return None
    # longest first, so a value that contains another is replaced whole
    vals = sorted(set(vals), key=lambda v: (-len(v), v))
    return re.compile("|".join(re.escape(v) for v in vals))


def _norm_values(secret_values: Iterable[str]) -> tuple[str, ...]:
    if not secret_values:
        return ()
    return tuple(sorted({v for v in secret_values if isinstance(v, str) and v}))


class Redactor:
    """Rule-based redactor. Construction validates the configuration; use is pure and thread-safe."""

    def __init__(self, extra_rules: dict[str, str] | None = None, disabled: Iterable[str] = ()) -> None:
        disabled = tuple(disabled)
        unknown = sorted(set(disabled) - set(BUILTIN_RULE_NAMES))
        if unknown:
            raise ValueError(
                f"unknown redaction rule(s) to disable: {', '.join(unknown)}; "
                f"built-in rules are: {', '.join(BUILTIN_RULE_NAMES)}"
            )
        rules = [r for r in BUILTIN_RULES if r.name not in disabled]
        active = {r.name for r in rules}
        for name, regex in (extra_rules or {}).items():
            if not isinstance(name, str) or not NAME_RE.fullmatch(name):
                raise ValueError(f"invalid redaction rule name {name!r}: must match [a-z0-9-]+")
            if name == FORM_SECRET:
                raise ValueError(f"redaction rule name {name!r} is reserved for secret form answers")
            if name in active:
                raise ValueError(
                    f"extra redaction rule {name!r} clashes with a built-in rule; disable the built-in one to replace it"
                )
            try:
                pattern = re.compile(regex)
            except (re.error, TypeError) as exc:
                raise ValueError(f"extra redaction rule {name!r}: invalid regex {regex!r}: {exc}") from None
            # a group named `secret` limits the replacement to that group, else the whole match
            group: int | str = "secret" if "secret" in pattern.groupindex else 0
            rules.append(Rule(name, pattern, group))
            active.add(name)
        self._rules: tuple[Rule, ...] = tuple(rules)
        self.rule_names: tuple[str, ...] = tuple(r.name for r in rules) + (FORM_SECRET,)

    # --- text ------------------------------------------------------------------------------

    def _triggered(self, s: str) -> list[Rule]:
        """The quick pre-check: rules whose literal triggers occur in ``s`` (plain substring
        tests, far cheaper than running the regexes or one combined regex)."""
        out: list[Rule] = []
        low: str | None = None
        for rule in self._rules:
            if not (rule.triggers or rule.itriggers):
                out.append(rule)
                continue
            for t in rule.triggers:
                if t in s:
                    out.append(rule)
                    break
            else:
                if rule.itriggers:
                    if low is None:
                        low = s.lower()
                    for t in rule.itriggers:
                        if t in low:
                            out.append(rule)
                            break
        return out

    def redact_text(self, s: str) -> tuple[str, Counter]:
        """Returns the redacted string (the same object when clean) and per-rule counts."""
        counts: Counter = Counter()
        if not s:
            return s, counts
        rules = self._triggered(s)
        if not rules:
            return s, counts
        # Later passes only need the rules triggered on the original text: a replacement only
        # removes text and inserts markers, and markers are never matched.
        for _ in range(_MAX_PASSES):
            changed = False
            for rule in rules:
                out, n = _apply_rule(rule, rule.name, s)
                if n:
                    counts[rule.name] += n
                    s = out
                    changed = True
            if not changed:
                break
        return s, counts

    def redact_secret_values(self, s: str, secret_values: Iterable[str]) -> tuple[str, int]:
        """Replaces every exact occurrence of the given values (length >= 1) with
        ``[REDACTED:form-secret]``; existing markers are left alone. Returns (text, count)."""
        pat = _values_pattern(_norm_values(secret_values))
        if pat is None:
            return s, 0
        return self._sub_values(pat, s)

    @staticmethod
    def _sub_values(pat: re.Pattern, s: str) -> tuple[str, int]:
        if not s or pat.search(s) is None:
            return s, 0
        spans = _marker_spans(s)
        n = 0

        def repl(m: re.Match) -> str:
            nonlocal n
            if spans and _overlaps(spans, m.start(), m.end()):
                return m.group(0)
            n += 1
            return _FORM_MARKER

        out = pat.sub(repl, s)
        return (out, n) if n else (s, 0)

    # --- events ----------------------------------------------------------------------------

    def redact_event(
        self,
        event: dict,
        secret_values: Iterable[str] = (),
        tracker: "SecretFieldTracker | None" = None,
    ) -> tuple[dict, Counter]:
        """Redacts every string value of ``event`` except the top-level envelope fields.

        ``secret_values``: exact values to replace everywhere (``[REDACTED:form-secret]``).
        ``tracker``: a ``SecretFieldTracker``; its ``secret_values()`` are added, and the secret
        fields of any ``elicitationResponse`` whose id it tracks are replaced whatever their type.
        Returns a new dict when anything changed (the input is never mutated; unchanged nested
        values are shared), else ``event`` itself.
        """
        values = _norm_values(secret_values)
        if tracker is not None:
            values = tuple(sorted(set(values) | set(tracker.secret_values())))
        pat = _values_pattern(values) if values else None
        counts: Counter = Counter()
        out: dict | None = None
        for k, v in event.items():
            if k in ENVELOPE_FIELDS:
                continue
            nv = self._walk(v, counts, pat, tracker)
            if nv is not v:
                if out is None:
                    out = dict(event)
                out[k] = nv
        return (event if out is None else out), counts

    def _walk(self, v: Any, counts: Counter, pat: re.Pattern | None, tracker: "SecretFieldTracker | None") -> Any:
        if isinstance(v, str):
            s = v
            if pat is not None:
                s, n = self._sub_values(pat, s)
                if n:
                    counts[FORM_SECRET] += n
            s, c = self.redact_text(s)
            if c:
                counts.update(c)
            return s if (s is not v) else v
        if isinstance(v, dict):
            out: dict | None = None
            fields = tracker.fields_for_response(v) if tracker is not None else ()
            for k, x in v.items():
                nx = self._walk(x, counts, pat, tracker)
                if nx is not x:
                    if out is None:
                        out = dict(v)
                    out[k] = nx
            if fields:
                key = "user_data" if isinstance(v.get("user_data"), dict) else "userData"
                data = (out if out is not None else v)[key]
                new_data: dict | None = None
                for f in fields:
                    if f in data and data[f] is not None and data[f] != _FORM_MARKER:
                        if new_data is None:
                            new_data = dict(data)
                        new_data[f] = _FORM_MARKER
                        counts[FORM_SECRET] += 1
                if new_data is not None:
                    if out is None:
                        out = dict(v)
                    out[key] = new_data
            return v if out is None else out
        if isinstance(v, (list, tuple)):
            outl: list | None = None
            for i, x in enumerate(v):
                nx = self._walk(x, counts, pat, tracker)
                if nx is not x:
                    if outl is None:
                        outl = list(v)
                    outl[i] = nx
            if outl is None:
                return v
            return tuple(outl) if isinstance(v, tuple) else outl
        return v


# --- secret form answers -----------------------------------------------------------------------


def _schema_secret_fields(schema: Any) -> list[str]:
    if not isinstance(schema, dict):
        return []
    props = schema.get("properties")
    if not isinstance(props, dict):
        return []
    out = []
    for name, prop in props.items():
        if isinstance(name, str) and isinstance(prop, dict):
            if prop.get("writeOnly") is True or prop.get("format") == "password":
                out.append(name)
    return out


def _id_key(x: Any) -> str | None:
    if isinstance(x, str):
        return x
    if isinstance(x, int) and not isinstance(x, bool):
        return str(x)
    return None


def _iter_dicts(obj: Any) -> Iterator[dict]:
    stack = [obj]
    while stack:
        x = stack.pop()
        if isinstance(x, dict):
            yield x
            stack.extend(reversed(list(x.values())))
        elif isinstance(x, (list, tuple)):
            stack.extend(reversed(x))


def _secret_value_text(v: Any) -> str | None:
    if isinstance(v, str):
        return v if v else None
    if isinstance(v, bool) or v is None:
        return None  # true/false/null are never redacted everywhere
    if isinstance(v, (int, float)):
        return json.dumps(v)
    return None


def _user_data(d: dict) -> dict | None:
    for key in ("user_data", "userData"):
        ud = d.get(key)
        if isinstance(ud, dict):
            return ud
    return None


class SecretFieldTracker:
    """Follows elicitation requests/responses of one run. Pure; ``to_dict``/``from_dict`` make it
    part of a run's persisted state. NOTE: the serialized form holds the secret values in clear
    text (they are needed to find later occurrences); keep that state as private as the raw log.
    """

    VERSION = 1

    def __init__(self) -> None:
        self._fields: dict[str, tuple[str, ...]] = {}  # elicitation id -> secret field names
        self._values: list[str] = []  # in order of discovery, unique
        self._value_set: set[str] = set()

    def observe(self, obj: Any) -> bool:
        """Scans any JSON value for elicitation requests (recording their secret fields) and for
        responses to tracked elicitations (recording the answered secret values). Requests are
        collected before responses, so both may sit in the same object. Returns True when the
        state changed."""
        changed = False
        dicts = list(_iter_dicts(obj))
        for d in dicts:
            if d.get("actionType") == "elicitation":
                eid = _id_key(d.get("id"))
                schema = d.get("requested_schema", d.get("requestedSchema"))
                fields = _schema_secret_fields(schema)
                if eid is not None and fields:
                    merged = tuple(dict.fromkeys(self._fields.get(eid, ()) + tuple(fields)))
                    if merged != self._fields.get(eid):
                        self._fields[eid] = merged
                        changed = True
        for d in dicts:
            fields = self.fields_for_response(d)
            if not fields:
                continue
            data = _user_data(d)
            for f in fields:
                text = _secret_value_text(data.get(f)) if data is not None else None
                if text is not None and text not in self._value_set:
                    self._value_set.add(text)
                    self._values.append(text)
                    changed = True
        return changed

    def fields_for_response(self, d: dict) -> tuple[str, ...]:
        """Secret field names when ``d`` is an ``elicitationResponse`` to a tracked elicitation."""
        if not self._fields or d.get("actionType") != "elicitationResponse":
            return ()
        eid = _id_key(d.get("id"))
        if eid is None or _user_data(d) is None:
            return ()
        return self._fields.get(eid, ())

    def secret_fields(self) -> dict[str, tuple[str, ...]]:
        return dict(self._fields)

    def secret_values(self) -> tuple[str, ...]:
        return tuple(self._values)

    def to_dict(self) -> dict:
        return {
            "version": self.VERSION,
            "fields": {k: list(v) for k, v in self._fields.items()},
            "values": list(self._values),
        }

    @classmethod
    def from_dict(cls, d: dict) -> "SecretFieldTracker":
        if not isinstance(d, dict) or d.get("version") != cls.VERSION:
            raise ValueError(f"unsupported SecretFieldTracker state: {d!r:.80}")
        t = cls()
        for k, v in (d.get("fields") or {}).items():
            t._fields[str(k)] = tuple(str(x) for x in v)
        for v in d.get("values") or ():
            if isinstance(v, str) and v and v not in t._value_set:
                t._value_set.add(v)
                t._values.append(v)
        return t

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SecretFieldTracker) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:  # never print the values
        return f"SecretFieldTracker(elicitations={len(self._fields)}, values={len(self._values)})"


# --- micro benchmark (not a test) ----------------------------------------------------------------


def _bench_events() -> tuple[list[dict], list[dict]]:
    clean = [
        {
            "eventId": f"laptop/20260926_3:{i}", "runId": "laptop/20260926_3", "seq": i, "type": "agent",
            "timestamp": "2026-09-26T14:02:13.000Z", "lines": [i, i],
            "message": "I'll start by looking at the project layout and then the pager module. "
            "Python slices are already end-exclusive, so every page drops its last item; "
            "setting max_tokens=4096 and rerunning the test suite with python3 -m pytest -q tests.",
        }
        for i in range(50)
    ] + [
        {
            "eventId": f"r:{i}", "runId": "r", "seq": i, "type": "unknown", "timestamp": "2026-09-26T14:02:13.000Z",
            "lines": [i, i],
            "raw": {"type": "toolResponse", "id": "toolu_01SCX2m1rKCtOylURFQz52vy", "toolResult": {"status": "success",
                    "value": {"content": [{"type": "text", "text": "src/  [187]\n  widgets/  [187]\n    pager.py  [22]\n" * 20}],
                              "isError": False}}},
        }
        for i in range(50)
    ]
    dirty = [
        {
            "eventId": f"r:{i}", "runId": "r", "seq": i, "type": "command", "timestamp": "2026-09-26T14:02:13.000Z",
            "lines": [i, i], "tool": "shell", "toolCallId": "toolu_01",
            "command": "curl -H 'Authorization: Bearer abcdef0123456789abcdef0123' "
            "https://deploy:s3cr3tpass@example.com/api && export API_KEY=9f8e7d6c5b4a "
            "AWS_ACCESS_KEY_ID=AKIAIOSFODNN7EXAMPLE GH=ghp_" + "a1B2c3D4e5" * 4,
        }
        for i in range(100)
    ]
    return clean, dirty


def bench(seconds: float = 0.5, redactor: Redactor | None = None) -> dict[str, float]:
    """Micro benchmark: events/s and strings/s of ``redact_event`` on clean and dirty events."""
    r = redactor or Redactor()
    clean, dirty = _bench_events()

    def nstrings(ev: Any) -> int:
        if isinstance(ev, str):
            return 1
        if isinstance(ev, dict):
            return sum(nstrings(v) for k, v in ev.items() if k not in ENVELOPE_FIELDS)
        if isinstance(ev, list):
            return sum(nstrings(v) for v in ev)
        return 0

    result: dict[str, float] = {}
    for label, events in (("clean", clean), ("dirty", dirty)):
        per_round = sum(nstrings(e) for e in events)
        rounds = 0
        t0 = time.perf_counter()
        while True:
            for e in events:
                r.redact_event(e)
            rounds += 1
            dt = time.perf_counter() - t0
            if dt >= seconds:
                break
        result[f"{label}_events_per_s"] = rounds * len(events) / dt
        result[f"{label}_strings_per_s"] = rounds * per_round / dt
    return result


if __name__ == "__main__":  # pragma: no cover
    for k, v in bench().items():
        print(f"{k:24s} {v:12,.0f}")
