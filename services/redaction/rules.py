"""Built-in secret-detection rules of the redactor.

Every rule has a bounded, stable ``name`` (used in the ``[REDACTED:<name>]`` marker and as a
metric label), a compiled ``pattern`` and the ``group`` whose text is replaced (0 = whole match;
an int or a group name). ``triggers`` / ``itriggers`` are cheap literal pre-checks: a rule's regex
only runs on a string that contains one of its case-sensitive ``triggers`` or (lower-cased) one of
its ``itriggers``; a rule with neither always runs. ``check`` can veto a match (e.g. placeholders).

Rules run in the order of ``BUILTIN_RULES``: whole blocks first (private keys), then
vendor-specific token shapes, then the contextual rules (bearer, URL passwords, assignments), so
the most specific name wins and contextual rules see the vendor markers instead of the secrets.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

MARKER_PREFIX = "[REDACTED:"
NAME_RE = re.compile(r"[a-z0-9-]+")
# Anything that looks like a marker is never redacted again (idempotence), whoever wrote it.
MARKER_RE = re.compile(r"\[REDACTED:[a-z0-9-]+\]")

FORM_SECRET = "form-secret"


def marker(name: str) -> str:
    return f"[REDACTED:{name}]"


@dataclass(frozen=True)
class Rule:
    name: str
    pattern: re.Pattern
    group: int | str = 0  # which group to replace (0 = whole match)
    triggers: tuple[str, ...] = ()  # case-sensitive literals, any of which must occur
    itriggers: tuple[str, ...] = ()  # lower-case literals searched in s.lower()
    check: Callable[[re.Match], bool] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not NAME_RE.fullmatch(self.name):
            raise ValueError(f"invalid redaction rule name {self.name!r}: must match [a-z0-9-]+")


# --- helpers for the contextual rules ---------------------------------------------------------

# `key = value` separators: =, :, :=, =>  (spaces/tabs around, never a newline)
_SEP = r"[ \t]*(?::=|=>|[:=])[ \t]*(?![=>])"

_PLACEHOLDER_VALUES = frozenset(
    {
        "none", "null", "nil", "undefined", "true", "false", "string", "str", "bool", "int",
        "required", "optional", "redacted", "empty",
    }
)

_ENV_REF_RE = re.compile(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?")
_TOKEN_KEY_RE = re.compile(r"(?i)token$")


_KEY_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")
_KEY_PREFIX_RE = re.compile(r"(?:[A-Za-z0-9]+[_\-.])*")
_CAMEL_PREFIX_RE = re.compile(r"(?:[A-Za-z0-9]+[_\-.])*[A-Za-z0-9]+")


def _assignment_key(m: re.Match) -> str | None:
    """The whole key ending in the matched key word, or None when the key word is only part of
    a longer word (mytoken, max_tokens) or a $reference. Keys are identifiers whose parts are
    joined by `_`, `-` or `.`: DB_PASSWORD, client_secret, x-api-key, config.password."""
    s = m.string
    start = m.start("kw")
    i = start
    while i > 0 and s[i - 1] in _KEY_CHARS:
        i -= 1
    prefix = s[i:start]
    if prefix and not _KEY_PREFIX_RE.fullmatch(prefix):
        # camelCase join: accessToken, clientSecret, nextPageToken (not mytoken)
        if not (m.group("kw")[:1].isupper() and (prefix[-1].islower() or prefix[-1].isdigit())
                and _CAMEL_PREFIX_RE.fullmatch(prefix)):
            return None
    if i > 0 and s[i - 1] == "$":
        return None
    return prefix + m.group("kw")


def _password_assignment_check(m: re.Match) -> bool:
    key = _assignment_key(m)
    if key is None:
        return False
    value = m.group("v")
    low = value.strip().lower()
    if low in _PLACEHOLDER_VALUES:
        return False  # a type name or a literal such as None/null/true, not a secret
    if set(value) <= {"*"} or set(value) <= {"x", "X"}:
        return False  # already masked
    if _ENV_REF_RE.fullmatch(value):
        return False  # a reference ($VAR / ${VAR}), not the secret itself
    if value.isdigit() and _TOKEN_KEY_RE.search(key):
        return False  # counters such as max_token=4096, token: 5000
    if key.lower() == "pwd" and value[:1] in ("/", "~", "."):
        return False  # PWD=/home/dev/project is the working directory, not a password
    return True


def _casings(words: list[str]) -> str:
    """lower, Title and UPPER forms of the key words, longest first, as one alternation. A
    case-sensitive alternation is ~10x faster than (?i) in Python's re (first-char prefilter)."""
    forms: set[str] = set()
    for w in words:
        forms.update({w, w[:1].upper() + w[1:], w.upper()})
    return "|".join(re.escape(f) for f in sorted(forms, key=lambda f: (-len(f), f)))


_KEYWORDS = _casings(
    ["password", "passwd", "passphrase", "pwd", "secret_key", "secret-key", "secretkey", "secretKey",
     "secret", "token", "api_key", "api-key", "apikey", "apiKey"]
)


def _build() -> tuple[Rule, ...]:
    R = re.compile
    rules = [
        Rule(
            "private-key",
            R(
                r"-----BEGIN[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----"
                r"(?:.*?-----END[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----"
                # no END (truncated output): the base64 body that follows
                r"|(?:[A-Za-z0-9+/=\s]|\\[nrt])*)",
                re.DOTALL,
            ),
            triggers=("PRIVATE KEY",),
        ),
        Rule(
            "aws-access-key-id",
            R(r"(?<![A-Za-z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Za-z0-9])"),
            triggers=("AKIA", "ASIA"),
        ),
        Rule(
            "aws-secret-access-key",
            R(
                r"(?i)(?<![a-z0-9])aws[_\-.]?secret[_\-.]?access[_\-.]?key(?![a-z0-9_\-])"
                r"(?:\\?[\"'])?" + _SEP + r"(?:\\?[\"'])?"
                r"([A-Za-z0-9/+=]{16,})(?![A-Za-z0-9/+=])"
            ),
            group=1,
            itriggers=("secret",),
        ),
        Rule(
            "gcp-api-key",
            R(r"(?<![A-Za-z0-9_\-])AIza[0-9A-Za-z_\-]{35}(?![0-9A-Za-z_\-])"),
            triggers=("AIza",),
        ),
        Rule(
            "github-token",
            R(
                r"(?<![A-Za-z0-9_])(?:gh[pousr]_[A-Za-z0-9]{36,}(?![A-Za-z0-9])"
                r"|github_pat_[A-Za-z0-9_]{82,}(?![A-Za-z0-9_]))"
            ),
            triggers=("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
        ),
        Rule(
            "gitlab-token",
            R(r"(?<![A-Za-z0-9_\-])glpat-[A-Za-z0-9_\-]{20,}"),
            triggers=("glpat-",),
        ),
        Rule(
            "slack-token",
            R(r"(?<![A-Za-z0-9_\-])xox[abpors]-[A-Za-z0-9][A-Za-z0-9\-]{9,}"),
            triggers=("xox",),
        ),
        Rule(
            "slack-webhook",
            # keep the well-known prefix, redact the secret path
            R(r"hooks\.slack\.com/(?:services|workflows|triggers)/([A-Za-z0-9_\-]+(?:/[A-Za-z0-9_\-]+)*)"),
            group=1,
            triggers=("hooks.slack.com",),
        ),
        Rule(
            "stripe-key",
            R(r"(?<![A-Za-z0-9_])[sr]k_live_[A-Za-z0-9]{10,}"),
            triggers=("_live_",),
        ),
        Rule(
            "anthropic-key",
            R(r"(?<![A-Za-z0-9_\-])sk-ant-[A-Za-z0-9_\-]{20,}"),
            triggers=("sk-ant-",),
        ),
        Rule(
            "openai-key",
            # sk-, sk-proj-, sk-svcacct-, sk-admin- + >= 20 chars, at least one digit (so that
            # hyphenated words such as "sk-learn-style-pipeline-configuration" never match)
            R(
                r"(?<![A-Za-z0-9_\-])sk-(?!ant-)(?:proj-|svcacct-|admin-)?"
                r"(?=[A-Za-z_\-]*[0-9])[A-Za-z0-9_\-]{20,}"
            ),
            triggers=("sk-",),
        ),
        Rule(
            "jwt",
            R(r"(?<![A-Za-z0-9_\-])eyJ[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{4,}\.[A-Za-z0-9_\-]{8,}(?![A-Za-z0-9_\-])"),
            triggers=("eyJ",),
        ),
        Rule(
            "bearer",
            # "Authorization: Bearer <token>" (any token >= 16 chars) or a bare "Bearer <token>"
            # whose token (>= 16 chars) contains a digit ("the bearer responsibilities" stays)
            R(
                r"(?:(?i:authorization)(?:\\?[\"'])?[ \t]*[:=][ \t]*(?:\\?[\"'])?(?i:bearer)[ \t]+"
                r"|(?<![A-Za-z0-9_])(?i:bearer)[ \t]+(?=[A-Za-z\-._~+/]*[0-9]))"
                r"([A-Za-z0-9\-._~+/]{16,}=*)(?![A-Za-z0-9\-._~+/=])"
            ),
            group=1,
            itriggers=("bearer",),
        ),
        Rule(
            "basic-auth-url",
            # scheme://user:password@host -> the password only; '@' inside the password is
            # accepted when another '@' follows before the path (p@ss@host)
            R(
                r"(?<![A-Za-z0-9+.\-])[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/?#@\"'<>\[\]]+:"
                r"(?!\[REDACTED:)((?:[^\s/?#@\"'<>]|@(?=[^\s/?#@\"'<>]*@))+)@"
            ),
            group=1,
            triggers=("://",),
        ),
        Rule(
            "password-assignment",
            # The regex starts at the key word (fast); the rest of the key (DB_, client_, x-api-,
            # config.) is checked by walking back in _password_assignment_check.
            R(
                r"(?P<kw>" + _KEYWORDS + r")"
                r"(?![A-Za-z0-9_\-])(?:\\?[\"'])?" + _SEP + r"(?!\[REDACTED:)"
                r"(?:(?P<dq>\\?\")|(?P<sq>'))?"
                r"(?P<v>(?(dq)(?:(?!\[REDACTED:)[^\"\\\r\n]){4,}"
                r"|(?(sq)(?:(?!\[REDACTED:)[^'\r\n]){4,}"
                r"|[^\s\"'`,;&|<>(){}\[\]\\]{4,})))"
            ),
            group="v",
            itriggers=("pass", "pwd", "secret", "token", "apikey", "api_key", "api-key"),
            check=_password_assignment_check,
        ),
    ]
    return tuple(rules)


BUILTIN_RULES: tuple[Rule, ...] = _build()
BUILTIN_RULE_NAMES: tuple[str, ...] = tuple(r.name for r in BUILTIN_RULES)
