"""The redactor's prefilter: which text rules a string can need, found before any rule runs.

A string shorter than the shortest possible match of every active text rule is skipped without
looking at it (``min_match_chars``, computed from the compiled patterns and the context their
checks require); a longer one goes through one search for every rule's literal triggers at once (a
trie regex on the lower-cased text), and only the rules whose triggers occur run. The answer is a
superset of the rules that can match (a property test holds ``Redactor.redact_text`` equal to
``redact_text_full``, which runs every rule).

Its own module because it is a seam of its own: built once per ``Redactor`` from its rules, asked
once per string, and replaceable (``enabled=False``, the reference path) without touching a rule.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from .rules import Rule, pattern_min_chars

# Follow characters of the pre-check literals (`token=`), and the length from which a string that
# passed the pre-check finds its rules by substring tests of the literals' stems.
_FOLLOW_CHARS = "\\\"' \t:=%\r\n\f\v"
_LONG = 2000


def _trie_pattern(literals: Iterable[str]) -> str:
    """A regex matching any of ``literals``, factored as a trie (``a(?:ccess|uth)|...``): the
    engine then tries one branch per first character instead of every literal at every position
    (about twice as fast as a flat alternation). A literal that is a prefix of another cuts the
    longer one short (enough to know that one of them occurs)."""
    root: dict[str, Any] = {}
    for word in literals:
        node = root
        for ch in word:
            node = node.setdefault(ch, {})
        node[""] = {}

    def emit(node: dict[str, Any]) -> str:
        if "" in node:
            return ""
        alts = [re.escape(ch) + emit(child) for ch, child in sorted(node.items())]
        return alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"

    return emit(root)


class Prefilter:
    """The rules of a ``Redactor`` that a string can need. ``enabled=False``: every rule, always."""

    def __init__(self, rules: tuple[Rule, ...], enabled: bool = True) -> None:
        self._rules = rules
        self._enabled = enabled
        # No active rule can match a string shorter than this (derived from the compiled
        # patterns, so extra rules lower it as needed).
        self.min_match_chars: int = min((pattern_min_chars(r.pattern) + r.context_chars for r in rules),
                                        default=1 << 30)
        if not enabled:
            self.min_match_chars = 0
        # The pre-check: one search for every rule's literal triggers at once, on the lower-cased
        # string (a superset of each rule's own condition: a case-sensitive trigger lower-cases
        # into its literal). Literals containing a shorter one are dropped (`token=` when
        # `token` is there); a literal found stands for every rule of every literal containing it.
        self._always = [r for r in rules if not (r.triggers or r.itriggers)]
        owners: dict[str, set[int]] = {}
        for i, r in enumerate(rules):
            for t in {t.lower() for t in r.triggers} | set(r.itriggers):
                owners.setdefault(t, set()).add(i)
        reduced = {t for t in owners if not any(o != t and o in t for o in owners)}
        self._literal_rules = {
            t: frozenset(i for o, rs in owners.items() if t in o for i in rs) for t in reduced
        }
        trie = _trie_pattern(reduced) if reduced else None
        self._gate = re.compile(trie) if trie else None
        # Which rules a string that passed needs: every literal at every position (overlapping
        # matches) for short strings; for long ones (where that scan costs more than a few
        # substring tests) the literals' stems without their follow character (`token` for
        # `token=`), a coarser superset.
        self._gate_all = re.compile("(?=(" + trie + "))") if trie else None
        stems: dict[str, set[int]] = {}
        for t, rs in self._literal_rules.items():
            stems.setdefault(t.rstrip(_FOLLOW_CHARS) or t, set()).update(rs)
        self._stem_rules = [(t, frozenset(rs)) for t, rs in sorted(stems.items())]

    def triggered(self, s: str) -> list[Rule]:
        """The quick pre-check: the rules whose literal triggers occur in ``s`` (a superset of the
        rules that can match it); most strings are answered by one search for any literal."""
        if not self._enabled:
            return list(self._rules)
        low = s.lower()
        first = self._gate.search(low) if self._gate is not None else None
        if first is None:
            return self._always
        assert self._gate_all is not None
        hit: set[int] = set()
        if len(low) <= _LONG:
            literal_rules = self._literal_rules
            for m in self._gate_all.finditer(low, first.start()):
                hit |= literal_rules[m.group(1)]
        else:
            for stem, rs in self._stem_rules:
                if stem in low:
                    hit |= rs
        rules = self._rules
        return [rules[i] for i in sorted(hit)] + self._always if self._always else [rules[i] for i in sorted(hit)]
