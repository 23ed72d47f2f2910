"""Pure, deterministic redaction of harness events (the raw log is never touched).

``Redactor.redact_event`` walks every value of an event (nested dicts and lists, at any depth,
iteratively: no recursion limit) except the identity fields (``IDENTITY_FIELDS``), and
replaces secrets with ``[REDACTED:<rule-name>]``:

- every string (and every string key of a nested object) goes through the text rules
  (``rules.BUILTIN_RULES`` plus configured extras);
- a value under an object key that names a secret (``rules.secret_key_kind``: password, token,
  DB_PASSWORD, SecretAccessKey, _authToken, ...) is replaced whole (``secret-field``), whatever
  the text rules found in it, unless it is a placeholder (null, ``$VAR``, ``****``) or the text
  rules already turned it into markers only (``Bearer [REDACTED:bearer]`` keeps its more specific
  name); numbers under password-like keys too; strings in a list under such a key too;
- an event cut at the span cap (``truncated: true``) loses the trailing fragment of its message
  (``truncated-tail``): the cut may have split a secret, and half a secret is not matched by any
  rule but still leaks;
- with a tracker, the lines of a private key block printed one line per event (stderr or
  non-JSON stdout ``warning`` events) are redacted until the block's END line (per stream when
  the caller gives the line's stream).

Never raises on a JSON value: the walk is iterative, keys that are not strings are left alone,
numbers of any size are never converted to text.

Idempotence: text that already looks like a marker (``[REDACTED:<name>]``) is never matched
again, and ``redact_text`` repeats its rule pass until nothing changes (at most a few passes; only
dirty strings pay for more than one), so ``redact(redact(x)) == redact(x)`` and the second pass
reports no counts.

Prefilter (``prefilter.py``): a string shorter than the shortest possible match of every active
text rule is skipped without looking at it (``Redactor.min_match_chars``); a longer one runs only
the rules whose literal triggers occur in it. ``Redactor(prefilter=False)`` / ``redact_text_full``
is the reference path.

Every rule is linear in its input (no unbounded lazy scans, bounded look-backs, marker overlap
by bisection), so a pathological line costs time in proportion to its size.

Secret form answers: a run's ``SecretFieldTracker`` (``forms.py``: per-run state, where this
module is pure and shared) names the values answered in its secret forms; they are then redacted
everywhere as ``[REDACTED:form-secret]``.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections import Counter
from collections.abc import Iterable, Iterator
from functools import lru_cache
from typing import Any

from .forms import SecretFieldTracker
from .prefilter import Prefilter
from .rules import (
    BUILTIN_RULE_NAMES,
    BUILTIN_RULES,
    FORM_SECRET,
    KEY_HEADER,
    MARKER_PREFIX,
    MARKER_RE,
    NAME_RE,
    SECRET_FIELD,
    STRUCTURAL_RULE_NAMES,
    TRUNCATED_TAIL,
    Match,
    Rule,
    is_placeholder,
    marker,
    secret_key_kind,
)

# Identity fields of a harness event, never redacted: the run key (chosen by whoever publishes
# the run, pattern-checked, and the key of every record and state: redacting it would break
# ordering and de-duplication), the ids derived from it, and what the service itself writes
# (order, type, time, line numbers). Every other field, `tool` and `toolCallId` included, is
# content that goose (or a model) wrote, and is redacted.
IDENTITY_FIELDS = frozenset({"eventId", "runId", "seq", "type", "timestamp", "lines"})

_MAX_PASSES = 4
_FORM_MARKER = marker(FORM_SECRET)
_SECRET_FIELD_MARKER = marker(SECRET_FIELD)
_TAIL_MARKER = marker(TRUNCATED_TAIL)
_PRIVATE_KEY = "private-key"
_PRIVATE_KEY_MARKER = marker(_PRIVATE_KEY)
# The tracker's key for a key block when the line's stream is not known.
ANY_STREAM = "*"
# A PEM body of the largest RSA keys in use (16384 bits) is about 200 lines of 64 characters.
MAX_KEY_BLOCK_LINES = 512
_KEY_CACHE_MAX = 4096
# Objects of the shape {"name": ..., "value": ...} carry the secret in these members when they sit
# under a secret key (cookie jars) or when their name names one (env lists of container specs, CI
# variables, AWS SSM parameters: {"Name": "/prod/db/password", "Value": "..."}).
_VALUE_KEYS = frozenset({"value", "values", "secret"})
_NAME_KEYS = ("name", "Name", "key", "Key")
_BIG = 1 << 62

# What may remain of a value under a secret key once the text rules ran, for their (more
# specific) markers to stand: scheme words, separators, blanks.
_LEFTOVER_RE = re.compile(r"(?i)(?:basic|bearer|token|digest|[\s:=,;\"'])*")

# Private key blocks printed one line per event.
_BLOCK_BEGIN_RE = re.compile(r"-----BEGIN[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----")
_BLOCK_END_RE = re.compile(r"-----END[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----")
# A line inside a PEM/OpenSSH block: base64, or an RFC 1421 / RFC 4716 header (Proc-Type: ...)
_BLOCK_BODY_RE = re.compile(r"[A-Za-z0-9+/=]+|" + KEY_HEADER + r":.*")


def _counter() -> Counter[str]:
    """An empty Counter without running ``Counter.__init__`` (which only calls ``update()``): a
    third of the cost of redacting a clean event was this constructor."""
    return Counter.__new__(Counter)


def _marker_spans(s: str) -> list[tuple[int, int]]:
    if MARKER_PREFIX not in s:
        return []
    return [m.span() for m in MARKER_RE.finditer(s)]


def _overlaps(spans: list[tuple[int, int]], start: int, end: int) -> bool:
    """Whether [start, end) touches one of the (sorted, disjoint) marker spans: a bisection, so
    a string with many markers stays linear."""
    i = bisect_right(spans, (start, _BIG))
    if i and spans[i - 1][1] > start:
        return True
    return i < len(spans) and spans[i][0] < end


def _apply_rule(rule: Rule, s: str) -> tuple[str, int]:
    """One ``sub`` of one rule; matches touching an existing marker or vetoed by ``check`` stay."""
    spans: list[tuple[int, int]] | None = None  # the markers of `s`, found at the first match
    n = 0
    rep = marker(rule.name)
    group = rule.group
    check = rule.check

    def repl(m: Match) -> str:
        nonlocal n, spans
        start, end = m.span(group)
        whole = m.group(0)
        if start < 0 or start == end:
            return whole
        if spans is None:
            spans = _marker_spans(s)
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
def _values_pattern(values: tuple[str, ...]) -> re.Pattern[str] | None:
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


def _only_markers(s: str) -> bool:
    """True when ``s`` holds at least one marker and nothing else but scheme words/separators."""
    if MARKER_PREFIX not in s:
        return False
    rest = MARKER_RE.sub("", s)
    return _LEFTOVER_RE.fullmatch(rest) is not None


def _pair_name(d: dict[Any, Any]) -> str | None:
    for key in _NAME_KEYS:
        name = d.get(key)
        if isinstance(name, str):
            return name
    return None


class _Frame:
    """One container being walked: its items, and the copy made on its first change."""

    __slots__ = ("node", "items", "is_dict", "kind", "out", "child", "renamed")

    def __init__(self, node: Any, kind: int) -> None:
        self.node = node
        self.is_dict = isinstance(node, dict)
        self.items: Iterator[tuple[Any, Any]] = iter(node.items()) if self.is_dict else enumerate(node)
        self.kind = kind  # secret-key kind inherited by list elements and `value` members (0: none)
        self.out: Any = None  # dict or list copy, made on the first change
        self.child: Any = None  # key or index of the container child being walked
        self.renamed: dict[str, str] | None = None  # keys that held secrets -> their redacted text

    def set(self, key: Any, value: Any) -> None:
        if self.out is None:
            self.out = dict(self.node) if self.is_dict else list(self.node)
        self.out[key] = value


# The end of a frame's items, compared by identity: an object, not a tuple (compiled code keeps
# tuples unboxed, so a tuple sentinel would never be identical to itself).
_DONE: Any = object()


class _Walk:
    """Per-event context: counts, form-secret values pattern, tracker."""

    __slots__ = ("counts", "pat", "tracker")

    def __init__(self, counts: Counter[str], pat: re.Pattern[str] | None, tracker: SecretFieldTracker | None) -> None:
        self.counts = counts
        self.pat = pat
        self.tracker = tracker


class Redactor:
    """Rule-based redactor. Construction validates the configuration; use is pure (the key-name
    cache aside) and thread-safe."""

    def __init__(
        self, extra_rules: dict[str, str] | None = None, disabled: Iterable[str] = (), prefilter: bool = True
    ) -> None:
        """``prefilter=False`` runs every active rule on every string (the reference path, for
        benchmarks and equivalence tests); the output is the same."""
        disabled = tuple(disabled)
        known = set(BUILTIN_RULE_NAMES) | set(STRUCTURAL_RULE_NAMES)
        unknown = sorted(set(disabled) - known)
        if unknown:
            raise ValueError(
                f"unknown redaction rule(s) to disable: {', '.join(unknown)}; "
                f"built-in rules are: {', '.join(BUILTIN_RULE_NAMES + STRUCTURAL_RULE_NAMES)}"
            )
        rules = [r for r in BUILTIN_RULES if r.name not in disabled]
        active = {r.name for r in rules} | {n for n in STRUCTURAL_RULE_NAMES if n not in disabled}
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
        self._structural = SECRET_FIELD not in disabled
        self._tail = TRUNCATED_TAIL not in disabled
        self._blocks = _PRIVATE_KEY not in disabled
        # The prefilter (prefilter.py): which rules a string needs, and the length below which none.
        self._pre = Prefilter(self._rules, prefilter)
        self.min_match_chars: int = self._pre.min_match_chars
        names = tuple(dict.fromkeys(r.name for r in rules))
        structural = tuple(n for n in STRUCTURAL_RULE_NAMES if n not in disabled)
        self.rule_names: tuple[str, ...] = names + structural + (FORM_SECRET,)
        self._key_cache: dict[str, tuple[str, tuple[tuple[str, int], ...]]] = {}
        self._key_infos: dict[str, tuple[int, str | None, tuple[tuple[str, int], ...]]] = {}

    # --- text ------------------------------------------------------------------------------

    def could_match(self, s: str) -> bool:
        """The prefilter: False means no text rule can change ``s`` (proven by a property test
        against ``redact_text_full``)."""
        return len(s) >= self.min_match_chars and bool(self._triggered(s))

    def _triggered(self, s: str) -> list[Rule]:
        return self._pre.triggered(s)

    def redact_text(self, s: str) -> tuple[str, Counter[str]]:
        """Returns the redacted string (the same object when clean) and per-rule counts."""
        counts = _counter()
        if len(s) < self.min_match_chars:
            return s, counts
        rules = self._triggered(s)
        if not rules:
            return s, counts
        return self._run(s, rules, counts)

    def redact_text_full(self, s: str) -> tuple[str, Counter[str]]:
        """``redact_text`` without the prefilter: every active rule runs (the reference path)."""
        return self._run(s, list(self._rules), _counter())

    def _run(self, s: str, rules: list[Rule], counts: Counter[str]) -> tuple[str, Counter[str]]:
        # Later passes only need the rules triggered on the original text: a replacement only
        # removes text and inserts markers, and markers are never matched.
        for _ in range(_MAX_PASSES):
            changed = False
            for rule in rules:
                out, n = _apply_rule(rule, s)
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
    def _sub_values(pat: re.Pattern[str], s: str) -> tuple[str, int]:
        if not s or pat.search(s) is None:
            return s, 0
        spans = _marker_spans(s)
        n = 0

        def repl(m: Match) -> str:
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
        event: dict[str, Any],
        secret_values: Iterable[str] = (),
        tracker: SecretFieldTracker | None = None,
        stream: str | None = None,
    ) -> tuple[dict[str, Any], Counter[str]]:
        """Redacts every value of ``event`` except the identity fields.

        ``secret_values``: exact values to replace everywhere (``[REDACTED:form-secret]``).
        ``tracker``: a ``SecretFieldTracker``; its ``secret_values()`` are added, and the secret
        fields of any ``elicitationResponse`` whose id it tracks are replaced whatever their type.
        With a tracker, a ``warning`` without ``code`` (a stderr line, a stdout line that is not
        JSON) is a line of the run's output, and a private key block printed over several such
        lines is followed in the tracker's state (which this call then changes). ``stream``: the
        raw stream of that line (stdout/stderr), so each stream has its own block; None: one
        block state for the run (see ``_block_line``).
        Returns a new dict when anything changed (the input is never mutated; unchanged nested
        values are shared), else ``event`` itself.
        """
        values = _norm_values(secret_values) if secret_values else ()
        if tracker is not None and tracker.has_values():
            values = tuple(sorted(set(values) | set(tracker.secret_values())))
        pat = _values_pattern(values) if values else None
        counts = _counter()
        ctx = _Walk(counts, pat, tracker)
        out: dict[str, Any] | None = None
        # A line-level event (a stderr line, a stdout line that is not JSON) of a run whose state
        # the tracker carries: private key blocks are followed across lines.
        block_line = (
            tracker is not None and self._blocks and event.get("type") == "warning"
            and "code" not in event and isinstance(event.get("message"), str)
        )
        for k, v in event.items():
            if k in IDENTITY_FIELDS:
                continue
            if block_line and k == "message":
                assert tracker is not None
                nv: Any = self._block_line(v, ctx, tracker, stream)
            elif isinstance(v, str):
                if len(v) < self.min_match_chars and pat is None:
                    continue  # nothing can match (the prefilter's first test, without a call)
                nv = self._leaf(v, ctx, 0)
            elif isinstance(v, (dict, list, tuple)):
                # Top-level names are the contract's field names (message, command, raw, ...),
                # never secret keys; nested object keys are looked at in the walk.
                nv = self._walk(v, ctx, 0)
            else:
                continue  # a number or a flag of the service (durationMs, isSuccess, truncated)
            if nv is not v:
                if out is None:
                    out = dict(event)
                out[k] = nv
        if self._tail and event.get("truncated") is True:
            msg = (out if out is not None else event).get("message")
            if isinstance(msg, str):
                cut = self._cut_tail(msg, counts)
                if cut is not msg:
                    if out is None:
                        out = dict(event)
                    out["message"] = cut
        return (event if out is None else out), counts

    # A value under a secret key, after the text rules ran on it.
    def _secret_value(self, original: str, redacted: str, kind: int, local: Counter[str], ctx: _Walk) -> str:
        if original == _SECRET_FIELD_MARKER or MARKER_RE.fullmatch(original) or is_placeholder(original):
            ctx.counts.update(local)
            return redacted
        if kind == 3 and original[:1] in ("/", "~", "."):
            ctx.counts.update(local)  # PWD / OLDPWD: a directory
            return redacted
        if _only_markers(redacted):
            ctx.counts.update(local)
            return redacted
        ctx.counts[SECRET_FIELD] += 1
        return _SECRET_FIELD_MARKER

    def _leaf(self, v: Any, ctx: _Walk, kind: int) -> Any:
        if isinstance(v, str):
            s = v
            if ctx.pat is not None:
                s, n = self._sub_values(ctx.pat, s)
                if n:
                    ctx.counts[FORM_SECRET] += n
            if kind:
                local = _counter()
                if len(s) >= self.min_match_chars:
                    rules = self._triggered(s)
                    if rules:
                        s, local = self._run(s, rules, local)
                return self._secret_value(v, s, kind, local, ctx)
            if len(s) >= self.min_match_chars:
                rules = self._triggered(s)
                if rules:
                    s, _ = self._run(s, rules, ctx.counts)
            return s
        if kind >= 2 and isinstance(v, (int, float)) and not isinstance(v, bool):
            ctx.counts[SECRET_FIELD] += 1
            return _SECRET_FIELD_MARKER
        return v

    def _key_info(self, k: str) -> tuple[int, str | None, tuple[tuple[str, int], ...]]:
        """What a nested object key is: its secret-key kind, and its redacted text (None when the
        text rules leave it alone) with their counts. Cached: keys repeat across events."""
        red, counts = self.redact_text(k)
        # The key as it will be written decides too: a key the text rules turn into one that names
        # a secret ("PROD_<jwt> PRIVATE KEY" -> "PROD_[REDACTED:jwt] PRIVATE KEY") would otherwise
        # get its value replaced only by a second pass, and redaction must be idempotent.
        kind = secret_key_kind(k) or secret_key_kind(red)
        info = (kind, red if red != k else None, tuple(counts.items()))
        if len(self._key_infos) >= _KEY_CACHE_MAX:
            self._key_infos.clear()
        self._key_infos[k] = info
        return info

    @staticmethod
    def _counted_key(info: tuple[int, str | None, tuple[tuple[str, int], ...]], ctx: _Walk) -> str:
        for name, n in info[2]:
            ctx.counts[name] += n
        assert info[1] is not None
        return info[1]

    def _key(self, k: str, ctx: _Walk) -> str:
        """A nested object key through the text rules (and form-secret values); cached."""
        s = k
        if ctx.pat is not None:
            s, n = self._sub_values(ctx.pat, s)
            if n:
                ctx.counts[FORM_SECRET] += n
        if len(s) < self.min_match_chars:
            return s if s != k else k
        hit = self._key_cache.get(s)
        if hit is None:
            red, c = self.redact_text(s)
            hit = (red, tuple(c.items()))
            if len(self._key_cache) >= _KEY_CACHE_MAX:
                self._key_cache.clear()
            self._key_cache[s] = hit
        for name, n in hit[1]:
            ctx.counts[name] += n
        return hit[0] if (hit[1] or s != k) else k

    def _finish_dict(self, f: _Frame, ctx: _Walk) -> Any:
        node: dict[Any, Any] = f.node
        cur: dict[Any, Any] = f.out if f.out is not None else node
        tracker = ctx.tracker
        fields = tracker.fields_for_response(node) if tracker is not None else ()
        if fields:
            key = "user_data" if isinstance(node.get("user_data"), dict) else "userData"
            data = cur[key]
            new_data: dict[Any, Any] | None = None
            for fname in fields:
                if fname in data and data[fname] is not None and data[fname] != _FORM_MARKER:
                    if new_data is None:
                        new_data = dict(data)
                    new_data[fname] = _FORM_MARKER
                    ctx.counts[FORM_SECRET] += 1
            if new_data is not None:
                if cur is node:
                    cur = dict(node)
                cur[key] = new_data
        renamed = f.renamed
        if renamed is not None:
            # Secrets in the keys themselves: rebuilt in order; keys that become equal get a suffix.
            rebuilt: dict[Any, Any] = {}
            for k, v in cur.items():
                base = renamed.get(k, k) if isinstance(k, str) else k
                nk, j = base, 2
                while nk in rebuilt:
                    nk = f"{base} ({j})"
                    j += 1
                rebuilt[nk] = v
            return rebuilt
        return node if cur is node else cur

    def _walk(self, root: Any, ctx: _Walk, kind: int = 0) -> Any:
        """The redacted copy of any JSON-like value (iterative: any depth)."""
        if not isinstance(root, (dict, list, tuple)):
            return self._leaf(root, ctx, kind)
        structural = self._structural
        short = self.min_match_chars
        pat = ctx.pat
        key_info = self._key_infos
        stack = [_Frame(root, kind)]
        result: Any = root
        while stack:
            f = stack[-1]
            item: Any = next(f.items, _DONE)
            if item is _DONE:
                stack.pop()
                if f.is_dict:
                    result = self._finish_dict(f, ctx)
                elif f.out is None:
                    result = f.node
                else:
                    result = tuple(f.out) if isinstance(f.node, tuple) else f.out
                if stack and result is not f.node:
                    stack[-1].set(stack[-1].child, result)
                continue
            k, child = item
            if f.is_dict:
                if isinstance(k, str):
                    info = key_info.get(k)
                    if info is None:
                        info = self._key_info(k)
                    ckind = info[0] if structural else 0
                    if not ckind and f.kind and k.lower() in _VALUE_KEYS:
                        ckind = f.kind  # {"cookies": [{"name": "sid", "value": "..."}]}
                    if info[1] is not None or pat is not None:
                        nk = self._key(k, ctx) if pat is not None else self._counted_key(info, ctx)
                        if nk != k:
                            if f.renamed is None:
                                f.renamed = {}
                            f.renamed[k] = nk
                else:
                    ckind = 0
            else:
                ckind = f.kind
            if isinstance(child, (dict, list, tuple)):
                f.child = k
                if structural and isinstance(child, dict):
                    # {"name": "DB_PASSWORD", "value": "..."}: the name says what the value is
                    named = _pair_name(child)
                    if named is not None:
                        ckind = max(ckind, secret_key_kind(named))
                stack.append(_Frame(child, ckind))
                continue
            if not ckind and pat is None and (not isinstance(child, str) or len(child) < short):
                continue  # a number, a flag, null, or a string too short for any rule
            nv = self._leaf(child, ctx, ckind)
            if nv is not child:
                f.set(k, nv)
        return result

    # --- truncated texts ---------------------------------------------------------------------

    @staticmethod
    def _cut_tail(msg: str, counts: Counter[str]) -> str:
        """The message of a truncated event with its trailing fragment (the run of non-blank
        characters the cap cut, after any marker) replaced: it may be the first half of a
        secret that no rule can recognise any more."""
        if not msg or msg[-1].isspace():
            return msg
        parts = msg.rsplit(None, 1)
        tail = parts[-1]
        start = len(msg) - len(tail)
        ends = [m.end() for m in MARKER_RE.finditer(tail)]
        if ends:
            start += ends[-1]
        if start >= len(msg):
            return msg
        counts[TRUNCATED_TAIL] += 1
        return msg[:start] + _TAIL_MARKER

    # --- private key blocks over several lines ---------------------------------------------------

    def _block_line(self, msg: str, ctx: _Walk, tracker: SecretFieldTracker, stream: str | None) -> str:
        """One line-level event. Inside a key block (per the tracker) a line of the key body
        (base64 or a header) is redacted whole, until the END line. With a known ``stream`` the
        block is that stream's, and any other line ends it early (the program evidently printed
        something else). Without one (``ANY_STREAM``) the block is the run's: a line that is not
        body is kept but does not end it (it may come from the other stream), and the block ends
        after ``MAX_KEY_BLOCK_LINES`` body lines without an END."""
        key = stream if stream is not None else ANY_STREAM
        lines = tracker.key_block_lines(key)
        if lines is not None:
            end = _BLOCK_END_RE.search(msg)
            if end is not None:
                tracker.set_key_block(key, None)
                rest: str = self._leaf(msg[end.end():], ctx, 0)
                ctx.counts[_PRIVATE_KEY] += 1
                return _PRIVATE_KEY_MARKER + rest
            if MARKER_RE.fullmatch(msg):
                return msg
            if _BLOCK_BODY_RE.fullmatch(msg.strip()):
                tracker.set_key_block(key, lines + 1 if lines + 1 < MAX_KEY_BLOCK_LINES else None)
                ctx.counts[_PRIVATE_KEY] += 1
                return _PRIVATE_KEY_MARKER
            if stream is not None:
                tracker.set_key_block(key, None)
        begins = list(_BLOCK_BEGIN_RE.finditer(msg))
        if begins:
            ends = list(_BLOCK_END_RE.finditer(msg))
            if not ends or ends[-1].start() < begins[-1].start():
                tracker.set_key_block(key, 0)
        out: str = self._leaf(msg, ctx, 0)
        return out
