"""Redaction of harness events before they are published (the raw log is never touched)."""

from .redactor import ENVELOPE_FIELDS, IDENTITY_FIELDS, Redactor, SecretFieldTracker, bench
from .rules import (
    BUILTIN_RULE_NAMES,
    BUILTIN_RULES,
    FORM_SECRET,
    SECRET_FIELD,
    STRUCTURAL_RULE_NAMES,
    TRUNCATED_TAIL,
    Rule,
    is_secret_key,
    marker,
)

__all__ = [
    "BUILTIN_RULES",
    "BUILTIN_RULE_NAMES",
    "ENVELOPE_FIELDS",
    "FORM_SECRET",
    "IDENTITY_FIELDS",
    "Redactor",
    "Rule",
    "SECRET_FIELD",
    "STRUCTURAL_RULE_NAMES",
    "SecretFieldTracker",
    "TRUNCATED_TAIL",
    "bench",
    "is_secret_key",
    "marker",
]
