"""Built-in secret-detection rules of the redactor (text forms) and the secret key names
(structural form).

Every rule has a bounded, stable ``name`` (used in the ``[REDACTED:<name>]`` marker and as a
metric label), a compiled ``pattern`` and the ``group`` whose text is replaced (0 = whole match;
an int or a group name). ``triggers`` / ``itriggers`` are cheap literal pre-checks: a rule's regex
only runs on a string that contains one of its case-sensitive ``triggers`` or (lower-cased) one of
its ``itriggers``; a rule with neither always runs. ``check`` can veto a match (e.g. placeholders).
Several rules may share a name (one family, several shapes); disabling the name disables them all.

Rules run in the order of ``BUILTIN_RULES``: whole blocks first (private keys), then
vendor-specific token shapes, then the contextual rules (headers, CLI forms, URL passwords,
assignments), so the most specific name wins and contextual rules see the vendor markers instead
of the secrets.

Names that are not text rules but share the marker and metric label space:
``secret-field`` (a JSON object key that names a secret: its value is replaced whole, see
``is_secret_key``), ``truncated-tail`` (the trailing fragment of a text cut at the span cap) and
``form-secret`` (values answered to secret form fields).
"""

from __future__ import annotations

import binascii
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache

MARKER_PREFIX = "[REDACTED:"
NAME_RE = re.compile(r"[a-z0-9-]+")
# Anything that looks like a marker is never redacted again (idempotence), whoever wrote it.
MARKER_RE = re.compile(r"\[REDACTED:[a-z0-9-]+\]")

FORM_SECRET = "form-secret"
SECRET_FIELD = "secret-field"
TRUNCATED_TAIL = "truncated-tail"

Match = re.Match[str]


def marker(name: str) -> str:
    return f"[REDACTED:{name}]"


@dataclass(frozen=True)
class Rule:
    name: str
    pattern: re.Pattern[str]
    group: int | str = 0  # which group to replace (0 = whole match)
    triggers: tuple[str, ...] = ()  # case-sensitive literals, any of which must occur
    itriggers: tuple[str, ...] = ()  # lower-case literals searched in s.lower()
    check: Callable[[Match], bool] | None = field(default=None, compare=False)
    # characters a match needs before it that `check` looks for (e.g. the command of a flag),
    # for the prefilter's shortest-match bound
    context_chars: int = 0

    def __post_init__(self) -> None:
        if not NAME_RE.fullmatch(self.name):
            raise ValueError(f"invalid redaction rule name {self.name!r}: must match [a-z0-9-]+")


# --- secret key names (structural redaction and the assignment rules) --------------------------

# A key names a secret when, lower-cased with `_ - .` and spaces removed, it ends with one of these
# words (DB_PASSWORD, client_secret, SecretAccessKey, x-api-key, _authToken, Set-Cookie) or is
# exactly one of the short words (`pass`, `pw` would match far too much as suffixes).
SECRET_KEY_SUFFIXES = (
    "password", "passwd", "passphrase", "pwd", "secret", "secretkey", "token", "apikey", "accesskey",
    "auth", "authorization", "cookie", "cookies", "privatekey", "credential", "credentials", "secretstring",
)
SECRET_KEY_EXACT = frozenset({"pass", "pw", "pin"})
# Keys whose numeric values are secrets too (a password of digits); counters such as
# max_token or tokens are numbers that are not.
_NUMERIC_SECRET_SUFFIXES = ("password", "passwd", "passphrase", "pwd", "secret", "pass", "pw", "pin")
_KEY_SEPARATORS = str.maketrans("", "", "_-. ")


@lru_cache(maxsize=8192)
def secret_key_kind(key: str) -> int:
    """0: the key names no secret; 1: its string values are secrets; 2: numbers too; 3: like 2,
    but a value that looks like a path is not a secret (PWD)."""
    k = key.translate(_KEY_SEPARATORS).lower()
    if not k or len(k) > 80:
        return 0
    if k in SECRET_KEY_EXACT or k.endswith(SECRET_KEY_SUFFIXES):
        if k.endswith("pwd"):
            return 3  # PWD / OLDPWD hold directories; a value that is a path is not a secret
        return 2 if (k in SECRET_KEY_EXACT or k.endswith(_NUMERIC_SECRET_SUFFIXES)) else 1
    return 0


def is_secret_key(key: object) -> bool:
    return isinstance(key, str) and secret_key_kind(key) > 0


# Values that are not secrets even under a secret key: type names, literals, auth scheme names.
PLACEHOLDER_VALUES = frozenset(
    {
        "none", "null", "nil", "undefined", "true", "false", "string", "str", "bool", "int",
        "required", "optional", "redacted", "empty", "basic", "bearer", "digest", "oauth", "oauth2",
        "token", "apikey", "api_key", "password", "secret", "n/a", "na", "unset", "<none>",
    }
)
ENV_REF_RE = re.compile(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?|%[A-Za-z_][A-Za-z0-9_]*%|\{\{[^{}]*\}\}")
_MASKED_CHARS = (frozenset("*"), frozenset("xX"), frozenset("•"), frozenset("#"))


def is_placeholder(value: str) -> bool:
    """A value that says nothing secret: a type name, a literal, a masked value, a reference."""
    low = value.strip().lower()
    if not low or low in PLACEHOLDER_VALUES:
        return True
    chars = frozenset(value)
    if any(chars <= m for m in _MASKED_CHARS):
        return True
    if low[:1] == "<" and low[-1:] == ">":
        return True  # <token>, <your-password>
    return ENV_REF_RE.fullmatch(value) is not None


# --- helpers for the contextual rules ---------------------------------------------------------

# `key = value` separators: =, :, :=, =>  (spaces/tabs around, never a newline)
_SEP = r"[ \t]*(?::=|=>|[:=])[ \t]*(?![=>])"

_TOKEN_KEY_RE = re.compile(r"(?i)token$")
_HEX2_RE = re.compile(r"[0-9A-Fa-f]{2}")
_KEY_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")
# The part of a key before the key word: leading separators (--password, _authToken), then
# words each followed by a separator (DB_, client_, x-api-, config.)
_KEY_PREFIX_RE = re.compile(r"[_\-.]*(?:[A-Za-z0-9]+[_\-.]+)*")
_CAMEL_PREFIX_RE = re.compile(r"[_\-.]*(?:[A-Za-z0-9]+[_\-.]+)*[A-Za-z0-9]+")


def _assignment_key(m: Match) -> str | None:
    """The whole key ending in the matched key word, or None when the key word is only part of
    a longer word (mytoken, max_tokens) or a $reference. Keys are identifiers whose parts are
    joined by `_`, `-` or `.`: DB_PASSWORD, client_secret, x-api-key, config.password, --token."""
    s = m.string
    start = m.start("kw")
    i = start
    while i > 0 and s[i - 1] in _KEY_CHARS:
        i -= 1
    prefix = s[i:start]
    if i > 0 and s[i - 1] == "%" and _HEX2_RE.match(prefix):
        prefix = prefix[2:]  # URL-encoded text: %3D, %26, %22 before the key end the word
    if prefix and not _KEY_PREFIX_RE.fullmatch(prefix):
        # camelCase join: accessToken, clientSecret, SecretAccessKey (not mytoken)
        if not (m.group("kw")[:1].isupper() and (prefix[-1].islower() or prefix[-1].isdigit())
                and _CAMEL_PREFIX_RE.fullmatch(prefix)):
            return None
    if i > 0 and s[i - 1] == "$":
        return None
    return prefix + m.group("kw")


def _password_assignment_check(m: Match) -> bool:
    key = _assignment_key(m)
    if key is None:
        return False
    value = m.group("v")
    if is_placeholder(value):
        return False  # a type name, a literal such as None/null/true, a mask or a $reference
    if value.isdigit() and _TOKEN_KEY_RE.search(key):
        return False  # counters such as max_token=4096, token: 5000
    if key.lower().endswith("pwd") and value[:1] in ("/", "~", "."):
        return False  # PWD=/home/dev/project is the working directory, not a password
    kw = m.group("kw").lower()
    if kw in ("auth", "cookie"):
        # `auth: required` is prose; only `_auth=...`, `"auth": "..."` and `--cookie=...` count
        between = _between(m)
        if "=" not in between and '"' not in between and "'" not in between:
            return False
    return True


def _between(m: Match) -> str:
    """The text between the key word and the value (quotes and separator)."""
    return m.string[m.end("kw"):m.start("v")]


def _flag_check(m: Match) -> bool:
    value = m.group("v")
    if m.group("key").startswith("no-"):
        return False  # --no-password takes no value
    inner = value[1:-1] if value[:1] in "\"'" and len(value) >= 2 else value
    return not (inner.startswith("-") or is_placeholder(inner))


def _value_check(m: Match) -> bool:
    value = m.group("v")
    inner = value[1:-1] if value[:1] in "\"'" and len(value) >= 2 else value
    return not is_placeholder(inner)


# How far back a flag looks for the command it belongs to (bounded: the regex anchors at the flag,
# so a line with thousands of `curl` words stays linear).
_COMMAND_LOOKBACK = 256


def _after_command(tool: str, between: str = r"[^\r\n|;&]*") -> Callable[[Match], bool]:
    """A check: the flag belongs to a command whose name matches ``tool``, earlier in the same
    command segment (not past a newline, `|`, `;` or `&`) and at most ``_COMMAND_LOOKBACK``
    characters back; ``between``: what may separate the command name from the flag. One
    end-anchored search of a bounded window, so a line of many flags stays linear-ish."""
    tool_re = re.compile(r"(?<![A-Za-z0-9_\-])" + tool + r"(?![A-Za-z0-9_\-])" + between + r"\Z")

    def check(m: Match) -> bool:
        end = m.start()
        seg = m.string[max(0, end - _COMMAND_LOOKBACK):end]
        cut = max(seg.rfind("\n"), seg.rfind("\r"), seg.rfind("|"), seg.rfind(";"), seg.rfind("&"))
        if cut >= 0:
            seg = seg[cut + 1:]
        return tool_re.search(seg) is not None and _value_check(m)

    return check


# --- vendor tokens: anchored on their own structure --------------------------------------------
#
# A vendor token is found by its own form (prefix, length, alphabet), never by a word boundary
# before it: the normalizers build names such as `mcp__<server>__<tool>` and
# `<extension>__<tool>`, and configs glue tokens to names (`PROD_ghp_...`, `key1AKIA...`). Where
# the old boundary protected ordinary words that merely start like a prefix (`mask-...`,
# `desk_live_...`, `laughs_...`), a token glued to a word character must prove itself by the
# part of its structure that words do not have: the CRC32 of GitHub's classic tokens, the
# base64url JSON header of a JWT, OpenAI's `T3BlbkFJ` marker, the numeric team segment of
# Slack tokens, the typed `sk-ant-<kind><nn>-` of Anthropic keys, the base32 alphabet (with a
# digit) of AWS key ids, the random-looking length of Stripe keys. After a blank, punctuation or
# the start of the text, the shape alone suffices, as before.

_WORD_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
_ALNUM_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
_IDENT_CHARS = _ALNUM_CHARS | frozenset("_")
_BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_BASE62_VALUE = {c: i for i, c in enumerate(_BASE62)}
_AWS_BASE32 = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567")
_OPENAI_MARKER = "T3BlbkFJ"  # base64 of "OpenAI", in the middle of every OpenAI secret key
_OPENAI_TYPED = ("sk-proj-", "sk-svcacct-", "sk-admin-")
_ANTHROPIC_TYPED_RE = re.compile(r"sk-ant-[a-z]{2,10}[0-9]{2}-")
_SLACK_TYPED_RE = re.compile(r"xox[abpors]-[0-9]+-")
# The random part of a GitHub classic token and its CRC32 in 6 base62 digits (GitHub, 2021).
_GITHUB_RANDOM = 30
_GITHUB_CRC = 6
_MAX_JWT_HEADER = 4096  # a JWT header is a few dozen bytes; longer is never decoded


def _glued(m: Match, chars: frozenset[str]) -> bool:
    """Whether the match follows one of ``chars`` directly."""
    i = m.start()
    return i > 0 and m.string[i - 1] in chars


def github_checksum_ok(token: str) -> bool:
    """A classic GitHub token (`gh?_` + 36): its last 6 base62 digits are the CRC32 of the 30
    random characters before them."""
    body = token[4:]
    if len(body) != _GITHUB_RANDOM + _GITHUB_CRC:
        return False
    n = 0
    for c in body[_GITHUB_RANDOM:]:
        v = _BASE62_VALUE.get(c)
        if v is None:
            return False
        n = n * 62 + v
    return n == zlib.crc32(body[:_GITHUB_RANDOM].encode("ascii", "replace"))


def _github_check(m: Match) -> bool:
    token = m.group(0)
    if token[3:4] == "_" and _glued(m, _ALNUM_CHARS):
        return github_checksum_ok(token)  # laughs_..., highs_...: only a real checksum counts
    return True


def _aws_key_id_check(m: Match) -> bool:
    if not _glued(m, _ALNUM_CHARS):
        return True
    body = m.group(0)[4:]  # FANTASIAMOVIECOLLECTIONS is a word, not ASIA + a key
    return all(c in _AWS_BASE32 for c in body) and any(c.isdigit() for c in body)


def _slack_check(m: Match) -> bool:
    return not _glued(m, _WORD_CHARS) or _SLACK_TYPED_RE.match(m.group(0)) is not None


def _random_looking(s: str) -> bool:
    return (any(c.isdigit() for c in s) and any(c.isupper() for c in s)
            and any(c.islower() for c in s))


def _stripe_check(m: Match) -> bool:
    if not _glued(m, _IDENT_CHARS):
        return True
    body = m.group(0)[len("sk_live_"):]  # desk_live_backupfolder is a name
    return len(body) >= 24 and _random_looking(body)


def _anthropic_check(m: Match) -> bool:
    return not _glued(m, _WORD_CHARS) or _ANTHROPIC_TYPED_RE.match(m.group(0)) is not None


def _openai_check(m: Match) -> bool:
    token = m.group(0)
    if not any(c.isdigit() for c in token[3:]):
        return False  # sk-learn-style-pipeline-configuration
    if not _glued(m, _WORD_CHARS):
        return True
    # mask-..., flask-..., task-...: words unless the key proves itself
    if _OPENAI_MARKER in token:
        return True
    for typed in _OPENAI_TYPED:
        if token.startswith(typed):
            rest = token[len(typed):]
            return len(rest) >= 40 and _random_looking(rest)
    return False


def jwt_header_ok(segment: str) -> bool:
    """Whether a JWT's first segment is base64url of a JSON object's text."""
    if len(segment) > _MAX_JWT_HEADER or len(segment) % 4 == 1:
        return False
    padded = segment.replace("-", "+").replace("_", "/") + "=" * (-len(segment) % 4)
    try:
        text = binascii.a2b_base64(padded).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return False
    return text.startswith('{"') and text.rstrip().endswith("}")


def _jwt_check(m: Match) -> bool:
    if not _glued(m, _WORD_CHARS):
        return True
    return jwt_header_ok(m.group(0).split(".", 1)[0])


def pattern_min_chars(pattern: str | re.Pattern[str]) -> int:
    """The fewest characters a match of ``pattern`` can span (0 when unknown)."""
    if isinstance(pattern, str):
        return _min_chars(pattern, 0)
    return _min_chars(pattern.pattern, pattern.flags)


@lru_cache(maxsize=1024)
def _min_chars(pattern: str, flags: int) -> int:
    import re._parser as sre_parse  # Python >= 3.11

    try:
        return int(sre_parse.parse(pattern, flags).getwidth()[0])
    except Exception:  # noqa: BLE001 - any doubt disables the prefilter for this rule
        return 0


def _command_chars(tool: str) -> int:
    """What an `_after_command` check needs before the flag: the command name and a blank."""
    return pattern_min_chars(tool) + 1


# ASCII whitespace (a netrc file's separators; `\s` would also take Unicode blanks, which the
# literal pre-check below could not list).
_WS_CHARS = " \t\r\n\f\v"
_WS = "[" + re.escape(_WS_CHARS) + "]"


def _follow(words: list[str], chars: str) -> tuple[str, ...]:
    """Pre-check literals (lower case) for a rule whose key word must be followed by one of
    ``chars``: `token=` and `token:` are worth running the rule for, `tokens` is not."""
    return tuple(w.lower() + c for w in words for c in chars)


def _alternation(words: list[str]) -> str:
    return "|".join(re.escape(w) for w in sorted(set(words), key=lambda w: (-len(w), w)))


# Key words of `key = value` assignments (case-insensitive; the key may extend to the left).
_KEYWORD_LIST = [
    "password", "passwd", "passphrase", "pwd", "secret_key", "secret-key", "secretkey", "secret", "token",
    "api_key", "api-key", "apikey", "access_key", "access-key", "accesskey", "private_key", "private-key",
    "privatekey", "auth", "cookie",
]
_KEYWORDS = _alternation(_KEYWORD_LIST)
# Their first letters, both cases: a leading `(?=[...])` lets the regex engine skip to candidate
# positions (a bare `(?i:...)` alternation is tried at every position, several times slower).
_KEY_FIRST = "".join(sorted({c for w in _KEYWORDS.split("|") for c in (w[0].lower(), w[0].upper())}))
# Key words of `--flag value` (separated by blanks; `--flag=value` is an assignment).
_FLAG_WORD_LIST = [
    "password", "passwd", "passphrase", "token", "secret", "api-key", "apikey", "access-key", "secret-key",
    "private-key", "cookie", "auth",
]
_FLAG_WORDS = _alternation(_FLAG_WORD_LIST)
# A shell word: a quoted string or a run of characters that ends a word in a command line.
_WORD = r"""(?:"[^"\r\n]*"|'[^'\r\n]*'|[^\s"'`;&|<>()]+)"""
# Commands whose flags carry a password (regexes of the command name, see `_after_command`).
_CURL = r"curl"
_SSHPASS = r"sshpass"
_SSHPASS_OPTIONS = r"(?:[ \t]+-(?:[fdP][ \t]*[^\s]+|[evhV]))*[ \t]+"  # what may come before its -p
# `-p<value>` glued means the password (`-p` alone prompts, `-p db` names a database).
_MYSQL_TOOLS = r"(?:mysql(?:dump|admin|import|show|check|pump|binlog|sh)?|mariadb(?:-dump|-admin|dump|admin)?)"
# `-p value` or `-pvalue`.
_LOGIN_TOOLS = (r"(?:(?:docker|podman|nerdctl|buildah|skopeo|oras)[ \t]+login|helm[ \t]+registry[ \t]+login"
                r"|mongo|mongosh)")
# redis-cli -a value; sqlcmd/bcp -P value.
_REDIS_CLI = r"redis-cli"
_SQLCMD = r"(?:sqlcmd|bcp)"


# Header lines inside a PEM (RFC 1421: Proc-Type, DEK-Info) or SSH2 (RFC 4716: Comment, Subject,
# x-...) key block: hyphenated names or the known ones ("error: ..." is not a header).
KEY_HEADER = r"(?:Proc-Type|DEK-Info|Comment|Subject|[A-Za-z0-9]+(?:-[A-Za-z0-9]+)+)"


def _build() -> tuple[Rule, ...]:
    R = re.compile
    rules = [
        Rule(
            "private-key",
            R(
                r"-----BEGIN[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----"
                # the body: base64, blanks, escaped newlines, header lines; then the END line if
                # it follows (without it: output cut short, or a block split over lines). The body
                # has no `-`, so each BEGIN scans only its own body (linear on any input).
                r"(?:(?:(?<=\n)|(?<=\\n))" + KEY_HEADER + r":[^\n\\]*|[A-Za-z0-9+/=\s]|\\[nrt])*"
                r"(?:-----END[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----)?",
                re.DOTALL,
            ),
            triggers=("PRIVATE KEY",),
        ),
        Rule(
            "aws-access-key-id",
            R(r"(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Za-z0-9])"),
            triggers=("AKIA", "ASIA"),
            check=_aws_key_id_check,
        ),
        Rule(
            "aws-secret-access-key",
            # aws_secret_access_key = ..., AWS_SECRET_ACCESS_KEY=..., "SecretAccessKey": "..." (AWS CLI JSON)
            R(
                r"(?=[aAsS])(?<![A-Za-z0-9])(?ai:(?:aws[_\-.]?)?secret[_\-.]?access[_\-.]?key)(?![A-Za-z0-9_\-])"
                r"(?:\\?[\"'])?" + _SEP + r"(?:\\?[\"'])?"
                r"([A-Za-z0-9/+=]{16,})(?![A-Za-z0-9/+=])"
            ),
            group=1,
            itriggers=_follow(["accesskey", "access_key", "access-key", "access.key"], "\\\"' \t:="),
        ),
        Rule(
            "gcp-api-key",
            # exactly 35 after the prefix; `__` after it is the normalizers' name separator
            R(r"AIza[0-9A-Za-z_\-]{35}(?![0-9A-Za-z\-]|_[0-9A-Za-z\-])"),
            triggers=("AIza",),
        ),
        Rule(
            "github-token",
            R(
                r"(?:gh[pousr]_[A-Za-z0-9]{36,}(?![A-Za-z0-9])"
                r"|github_pat_[A-Za-z0-9_]{82,}(?![A-Za-z0-9_]))"
            ),
            triggers=("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
            check=_github_check,
        ),
        Rule(
            "gitlab-token",
            R(r"glpat-[A-Za-z0-9_\-]{20,}"),
            triggers=("glpat-",),
        ),
        Rule(
            "slack-token",
            R(r"xox[abpors]-[A-Za-z0-9][A-Za-z0-9\-]{9,}"),
            triggers=("xox",),
            check=_slack_check,
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
            R(r"[sr]k_live_[A-Za-z0-9]{10,}"),
            triggers=("_live_",),
            check=_stripe_check,
        ),
        Rule(
            "anthropic-key",
            R(r"sk-ant-[A-Za-z0-9_\-]{20,}"),
            triggers=("sk-ant-",),
            check=_anthropic_check,
        ),
        Rule(
            "openai-key",
            # sk-, sk-proj-, sk-svcacct-, sk-admin- + >= 20 chars, at least one digit (so that
            # hyphenated words such as "sk-learn-style-pipeline-configuration" never match)
            # (the digit is looked for by the check: a lookahead scanning for it from every
            # `sk-` of a long `sk-sk-sk-...` run would be quadratic)
            R(r"sk-(?!ant-)(?:proj-|svcacct-|admin-)?[A-Za-z0-9_\-]{20,}"),
            triggers=("sk-",),
            check=_openai_check,
        ),
        Rule(
            "jwt",
            # signed (three segments) or unsigned (alg "none": header.payload. with an empty
            # signature, both segments base64url JSON objects)
            # A header glued to a word character stops at the next `eyJ`, so a run of many `eyJ`
            # is scanned once (each start would otherwise scan to the run's end: quadratic).
            R(
                r"(?:(?<![A-Za-z0-9_\-])eyJ[A-Za-z0-9_\-]{10,}|(?<=[A-Za-z0-9_\-])eyJ(?:(?!eyJ)[A-Za-z0-9_\-]){10,})\."
                r"(?:[A-Za-z0-9_\-]{4,}\.[A-Za-z0-9_\-]{8,}|eyJ[A-Za-z0-9_\-]{2,}\.)"
                # not a longer token (`_x`, `.x`: a JWE's fourth segment); `__` and a full stop may follow
                r"(?![A-Za-z0-9\-]|_[A-Za-z0-9\-]|\.[A-Za-z0-9_\-])"
            ),
            triggers=("eyJ",),
            check=_jwt_check,
        ),
        Rule(
            "bearer",
            # "Authorization: Bearer <token>" (any token >= 16 chars) or a bare "Bearer <token>"
            # whose token (>= 16 chars) contains a digit ("the bearer responsibilities" stays)
            R(
                r"(?=[aAbB])(?:(?ai:authorization)(?:\\?[\"'])?[ \t]*[:=][ \t]*(?:\\?[\"'])?(?ai:bearer)[ \t]+"
                r"|(?<![A-Za-z0-9_])(?ai:bearer)[ \t]+(?=[A-Za-z\-._~+/]*[0-9]))"
                r"([A-Za-z0-9\-._~+/]{16,}=*)(?![A-Za-z0-9\-._~+/=])"
            ),
            group=1,
            itriggers=_follow(["bearer"], " \t"),
        ),
        Rule(
            "authorization",
            # Authorization / Proxy-Authorization headers with any other scheme (Basic, token,
            # Digest, ...) or a bare credential; a Bearer token too short for the bearer rule
            R(
                r"(?=[pPaA])(?<![A-Za-z0-9_\-])(?ai:(?:proxy-)?authorization)(?:\\?[\"'])?[ \t]*[:=][ \t]*(?:\\?[\"'])?"
                r"(?:(?ai:basic|bearer|token|digest|negotiate|ntlm|apikey|api-key|sso-key|aws4-hmac-sha256)[ \t]+"
                r"(?P<v>(?!\[REDACTED:)[^\s\"'\\]{4,}))"
            ),
            group="v",
            itriggers=_follow(["authorization"], "\\\"' \t:="),
            check=_value_check,
        ),
        Rule(
            "authorization",
            R(
                r"(?=[pPaA])(?<![A-Za-z0-9_\-])(?ai:(?:proxy-)?authorization)(?:\\?[\"'])?[ \t]*[:=][ \t]*(?:\\?[\"'])?"
                r"(?P<v>(?!\[REDACTED:)(?!(?ai:basic|bearer|token|digest|negotiate|ntlm|apikey|api-key|sso-key)[ \t])"
                r"(?=[^\s\"'\\]*[0-9])[^\s\"'\\]{8,})"
            ),
            group="v",
            itriggers=_follow(["authorization"], "\\\"' \t:="),
            check=_value_check,
        ),
        Rule(
            "cookie",
            # Cookie: / Set-Cookie: headers: the whole value (name=value pairs and attributes)
            R(
                r"(?=[sScC])(?<![A-Za-z0-9_\-])(?ai:set-cookie|cookie)(?:\\?[\"'])?[ \t]*:[ \t]*(?:\\?[\"'])?"
                r"(?P<v>(?!\[REDACTED:)[^\s=;\"'\\]+=[^\r\n\"'\\]*)"
            ),
            group="v",
            itriggers=_follow(["cookie"], "\\\"' \t:"),
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
            "cli-password",
            # curl -u user:pw / --user user:pw / -U (proxy): the part after the first colon
            R(
                r"(?<=[ \t])(?:-u|-U|--user|--proxy-user)(?:[ \t]+|=|(?=[^\s-]))"
                r"[^\s\"':]*:(?P<v>(?!\[REDACTED:)[^\s\"'`;&|<>()]+)"
            ),
            group="v",
            triggers=("curl",),
            check=_after_command(_CURL),
            context_chars=_command_chars(_CURL),
        ),
        Rule(
            "cli-password",
            R(
                r"(?<=[ \t])(?:-u|-U|--user|--proxy-user)(?:[ \t]+|=|(?=[^\s-]))"
                r"[\"'][^\"'\r\n:]*:(?P<v>(?!\[REDACTED:)[^\"'\r\n]+)"
            ),
            group="v",
            triggers=("curl",),
            check=_after_command(_CURL),
            context_chars=_command_chars(_CURL),
        ),
        Rule(
            "cli-password",
            # sshpass [-f F|-d N|-P P|-e|-v] -p PASSWORD (glued or not)
            R(r"(?<=[ \t])-p[ \t]*(?P<v>(?!\[REDACTED:)(?!-)" + _WORD + ")"),
            group="v",
            triggers=("sshpass",),
            check=_after_command(_SSHPASS, _SSHPASS_OPTIONS),
            context_chars=_command_chars(_SSHPASS),
        ),
        Rule(
            "cli-password",
            # mysql -u root -pSECRET (glued; `-p` alone prompts, `-p db` names a database)
            R(r"(?<=[ \t])-p(?P<v>(?!\[REDACTED:)" + _WORD + ")"),
            group="v",
            triggers=("mysql", "mariadb"),
            check=_after_command(_MYSQL_TOOLS),
            context_chars=_command_chars(_MYSQL_TOOLS),
        ),
        Rule(
            "cli-password",
            # docker/podman/helm registry login -p X, mongo/mongosh -p X (blank-separated or glued)
            R(r"(?<=[ \t])-p[ \t]*(?P<v>(?!\[REDACTED:)(?!-)" + _WORD + ")"),
            group="v",
            triggers=("login", "mongo"),
            check=_after_command(_LOGIN_TOOLS),
            context_chars=_command_chars(_LOGIN_TOOLS),
        ),
        Rule(
            "cli-password",
            # redis-cli -a X
            R(r"(?<=[ \t])-a[ \t]*(?P<v>(?!\[REDACTED:)(?!-)" + _WORD + ")"),
            group="v",
            triggers=("redis-cli",),
            check=_after_command(_REDIS_CLI),
            context_chars=_command_chars(_REDIS_CLI),
        ),
        Rule(
            "cli-password",
            # sqlcmd/bcp -P X
            R(r"(?<=[ \t])-P[ \t]*(?P<v>(?!\[REDACTED:)(?!-)" + _WORD + ")"),
            group="v",
            triggers=("sqlcmd", "bcp"),
            check=_after_command(_SQLCMD),
            context_chars=_command_chars(_SQLCMD),
        ),
        Rule(
            "cli-password",
            # --password VALUE, --api-key VALUE, --token VALUE (blank-separated; =VALUE is an assignment)
            R(
                r"(?<![A-Za-z0-9_\-])--(?P<key>(?:[a-z0-9]+-)*(?:" + _FLAG_WORDS + r"))[ \t]+"
                r"(?P<v>(?!\[REDACTED:)" + _WORD + ")"
            ),
            group="v",
            itriggers=_follow(_FLAG_WORD_LIST, " \t"),
            check=_flag_check,
        ),
        Rule(
            "netrc",
            # .netrc: machine HOST login USER password SECRET (one line or several)
            R(
                r"(?<![A-Za-z0-9_\-])(?:machine[ \t]+\S+|default|login[ \t]+\S+)"
                r"(?:" + _WS + r"+(?:login|account)" + _WS + r"+\S+){0,3}" + _WS + r"+password" + _WS
                + r"+(?P<v>(?!\[REDACTED:)\S+)"
            ),
            group="v",
            itriggers=_follow(["password"], _WS_CHARS),
            check=_value_check,
        ),
        Rule(
            "password-assignment",
            # The regex starts at the key word; the rest of the key (DB_, client_, x-api-, --,
            # _auth, config.) is checked by walking back in _password_assignment_check.
            R(
                r"(?=[" + _KEY_FIRST + r"])(?P<kw>(?ai:" + _KEYWORDS + r"))"
                r"(?![A-Za-z0-9_\-])(?:\\?[\"'])?" + _SEP + r"(?!\[REDACTED:)"
                r"(?:(?P<dq>\\?\")|(?P<sq>'))?"
                r"(?P<v>(?(dq)(?:(?!\[REDACTED:)[^\"\\\r\n]){4,}"
                r"|(?(sq)(?:(?!\[REDACTED:)[^'\r\n]){4,}"
                r"|[^\s\"'`,;&|<>(){}\[\]\\]{4,})))"
            ),
            group="v",
            itriggers=_follow(_KEYWORD_LIST, "\\\"' \t:="),
            check=_password_assignment_check,
        ),
        Rule(
            "password-assignment",
            # URL-encoded: password%3Dhunter2%26next%3D..., "password"%3A%22...%22
            R(
                r"(?=[" + _KEY_FIRST + r"])(?P<kw>(?ai:" + _KEYWORDS + r"))"
                r"(?![A-Za-z0-9_\-])(?:%22)?(?:%3[Dd]|%3[Aa])(?:%20)*(?:%22)?"
                r"(?P<v>(?!\[REDACTED:)(?:[A-Za-z0-9._~!*+\-]|%(?!26|22|2[Cc]|3[Bb])[0-9A-Fa-f]{2}){4,})"
            ),
            group="v",
            itriggers=_follow(_KEYWORD_LIST, "%"),
            check=_password_assignment_check,
        ),
    ]
    return tuple(rules)


BUILTIN_RULES: tuple[Rule, ...] = _build()
BUILTIN_RULE_NAMES: tuple[str, ...] = tuple(dict.fromkeys(r.name for r in BUILTIN_RULES))
# Names the redactor itself uses beyond the text rules (structural values, truncated tails).
STRUCTURAL_RULE_NAMES: tuple[str, ...] = (SECRET_FIELD, TRUNCATED_TAIL)
