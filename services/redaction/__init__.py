"""Redaction of harness events before they are published (the raw log is never touched)."""

from .redactor import ENVELOPE_FIELDS, Redactor, SecretFieldTracker, bench
from .rules import BUILTIN_RULE_NAMES, BUILTIN_RULES, FORM_SECRET, Rule, marker

__all__ = [
    "BUILTIN_RULES",
    "BUILTIN_RULE_NAMES",
    "ENVELOPE_FIELDS",
    "FORM_SECRET",
    "Redactor",
    "Rule",
    "SecretFieldTracker",
    "bench",
    "marker",
]
