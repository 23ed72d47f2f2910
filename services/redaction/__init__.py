"""Redaction of harness events before they are published (the raw log is never touched)."""

from .forms import SecretFieldTracker
from .redactor import IDENTITY_FIELDS, Redactor
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
    "FORM_SECRET",
    "IDENTITY_FIELDS",
    "Redactor",
    "Rule",
    "SECRET_FIELD",
    "STRUCTURAL_RULE_NAMES",
    "SecretFieldTracker",
    "TRUNCATED_TAIL",
    "is_secret_key",
    "marker",
]
