"""Classify shell command strings into file operations (contract section 3.6).

Pure, stdlib-only, linear-time and never raising.  The single public entry
point is :func:`classify_shell`.

Contract 3.6 in short: tokenize like a POSIX shell, unwrap one ``bash``/``sh``
``-c SCRIPT``, classify the *first simple command* by the basename of its
program (``cat``, ``sed -n``, ``rg``/``grep``, ``find``, ``ls``); anything
else is a plain ``command`` event (``None`` here).  Paths are the token text
after quote removal, never normalized.

Decisions taken where the contract is silent (each one has a test):

Tokenizing and the first simple command: ``shell_tokens`` (its docstring lists
those decisions).

bash / sh unwrap
  * Program basename exactly ``bash`` or ``sh``; its options are scanned up
    to the first non-option word (``--`` or a lone ``-`` end options;
    ``-o``/``+o``/``-O``/``+O`` and ``--rcfile``/``--init-file`` take a
    value).  If any single-dash cluster contains ``c`` (``-c``, ``-lc``,
    ``-ic``, ``-euc``, or ``-l -c``) the first non-option word is the SCRIPT
    and the SCRIPT is classified instead, one level only (a ``bash -c``
    inside it is a plain command).  Without ``c`` or without a SCRIPT → None.

cat
  * Operands are non-option words; ``-x``/``--long`` options are skipped, a
    lone ``-`` (stdin) is ignored, ``--`` ends options.
  * Operands → one read per operand, in order.  An output redirection on the
    same command (``cat a > b``) is ignored: reads only.
  * No operands and a stdout redirection (``>``, ``>>``, ``>|``, ``&>``,
    ``&>>``, ``>&FILE``; fd absent or 1) → one write of the *last* such
    target (that is where bash sends the output).  ``2> f`` is not a write.
  * An empty operand (``cat ""``) is an empty required path → None.

sed
  * Requires ``-n`` as its own word (``-ne``, ``--quiet`` → None).  Allowed
    extra options: ``-e S``/``-eS``/``--expression[=]S`` (exactly one script),
    ``-E -r -s -u -z --posix --debug --sandbox --regexp-extended --separate
    --unbuffered --null-data``, ``-l N``/``--line-length[=]N``.  Anything
    else (``-i``, ``-f``, ...) → None.
  * Script (first operand, or the ``-e`` value) must be ``ADDR[,ADDR]p`` with
    ADDR a line number, ``$`` or a regex (``/re/`` or ``\\cREc``, optional
    ``I``/``M`` flags); blanks around are allowed.  Anything else
    (``1,5d``, ``p``, ``1~2p``, ``1,+3p``, ``1,5p;q``) → None.
  * Lines: ``Np`` → start=end=N; ``A,Bp`` → start A, end B (if B < A sed
    prints only line A, so end = A); ``A,$p`` → start A only.  A number that
    is 0 or longer than 18 digits, ``$`` as first address, or any regex
    address → read with no lines.
  * File = last operand (a lone ``-``, stdin, is ignored); none → None.

grep / rg
  * GNU-getopt style: options anywhere before ``--``; short clusters are
    walked left to right and a value-taking letter takes the rest of the
    cluster (``-A3``, ``-rA3``) or, at the end of the cluster, the next word
    (``-rA 3``).  ``--opt=value`` never takes the next word.
  * Value-taking options are the ones listed in the brief plus, for grep,
    ``-d -D --directories --devices --label --binary-files --exclude-from
    --group-separator`` and, for rg, ``-d --color --colors --context-separator
    --dfa-size-limit --regex-size-limit --engine --field-context-separator
    --field-match-separator --path-separator --ignore-file --type-add
    --type-clear --pre-glob --hyperlink-format --generate``.
  * Query = first ``-e``/``--regexp`` value (then every operand is a path),
    else the first operand.  ``-f``/``--file`` without ``-e`` (pattern from a
    file) → None.  ``rg --files`` / ``rg --type-list`` (no pattern) → None.
    Path = the next operand if any.  Empty query → None; empty path omitted.
  * A value-taking option with no value (``grep foo -A``) → None.

find
  * Leading global options ``-H -L -P -O<n> -D <opts>`` are skipped.
  * Start path = first word before the expression (expression words start
    with ``-``, ``(`` or ``!``); further start paths are ignored.
  * Query = value of the first ``-name``/``-iname``/``-path`` (values of
    other one-argument predicates and ``-exec ... ;`` bodies are skipped so
    they cannot be mistaken for it), else the start path.  ``-name`` with no
    value → None.  Empty query → None; empty start path is omitted.

ls
  * Path = last non-option operand; value options ``-I -w -T`` and
    ``--block-size --format --hide --ignore --indicator-style --quoting-style
    --sort --tabsize --time --time-style --width`` skip their value.  No
    operand (or an empty one) → ``{"type": "list"}``.

Performance: compiled patterns live at module level, tokenizing is lazy (it
stops at the end of the first simple command) and linear; results for
commands up to 8 KiB are memoized (LRU 4096) as immutable tuples, callers
always get fresh dicts.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Any, Literal

from services.normalizer.shell_tokens import ASSIGN_RE, DIGITS_RE, first_simple_command

__all__ = ["classify_shell", "shell_kinds"]

_STDOUT_REDIRECTS = frozenset({">", ">>", ">|", "&>", "&>>", ">&"})


# ---------------------------------------------------------------------------
# Per-program rules.  Each returns a tuple of op tuples, or None.
# An op tuple is a tuple of (key, value) pairs, turned into a dict by the
# public function.
# ---------------------------------------------------------------------------


def _cat(args: list[str], redirects: list[tuple[Any, ...]]) -> tuple[Any, ...] | None:
    operands: list[str] = []
    end_opts = False
    for w in args:
        if w == "-":
            continue
        if not end_opts and w.startswith("-"):
            if w == "--":
                end_opts = True
            continue
        operands.append(w)
    if operands:
        if any(not p for p in operands):
            return None
        return tuple(((("type", "read"), ("path", p))) for p in operands)
    target = None
    for op, fd, tgt in redirects:
        if op not in _STDOUT_REDIRECTS:
            continue
        if op in ("&>", "&>>"):
            if fd is not None:
                continue
        elif fd is not None and fd.lstrip("0") != "1":
            continue
        if op == ">&" and (tgt == "-" or DIGITS_RE.match(tgt)):
            continue  # fd duplication, not a file
        target = tgt
    if target:
        return ((("type", "write"), ("path", target)),)
    return None


_SED_FLAGS = frozenset({
    "-E", "-r", "-s", "-u", "-z", "--posix", "--debug", "--sandbox",
    "--regexp-extended", "--separate", "--unbuffered", "--null-data",
})
_MAX_LINE_DIGITS = 18


def _line_number(digits: str) -> int | None:
    """A valid (>= 1, at most 18 significant digits) line number, else None."""
    d = digits.lstrip("0")
    if not d or len(d) > _MAX_LINE_DIGITS:
        return None
    return int(d)


def _sed_addr(sc: str, pos: int) -> tuple[Any, ...] | None:
    """Parse one sed address at ``pos``: return ``(kind, value, new_pos)`` or None."""
    n = len(sc)
    if pos >= n:
        return None
    c = sc[pos]
    if "0" <= c <= "9":
        e = pos
        while e < n and "0" <= sc[e] <= "9":
            e += 1
        return ("num", sc[pos:e], e)
    if c == "$":
        return ("last", None, pos + 1)
    if c == "/" or c == "\\":
        if c == "\\":
            if pos + 1 >= n:
                return None
            delim = sc[pos + 1]
            if delim in "\\\n":
                return None
            j = pos + 2
        else:
            delim = "/"
            j = pos + 1
        while j < n:
            d = sc[j]
            if d == "\\":
                j += 2
                continue
            if d == delim:
                j += 1
                while j < n and sc[j] in "IM":
                    j += 1
                return ("re", None, j)
            j += 1
        return None
    return None


def _skip_sed_blanks(sc: str, pos: int) -> int:
    while pos < len(sc) and sc[pos] in " \t":
        pos += 1
    return pos


def _sed_range(script: str) -> tuple[Any, ...] | Literal[False]:
    """Return ``(start, end)`` (either may be None) or False if not ``ADDR[,ADDR]p``."""
    sc = script.strip(" \t\n")
    a1 = _sed_addr(sc, 0)
    if a1 is None:
        return False
    pos = _skip_sed_blanks(sc, a1[2])
    a2 = None
    if pos < len(sc) and sc[pos] == ",":
        a2 = _sed_addr(sc, _skip_sed_blanks(sc, pos + 1))
        if a2 is None:
            return False
        pos = _skip_sed_blanks(sc, a2[2])
    if sc[pos:] != "p":
        return False
    if a1[0] != "num":
        return (None, None)
    start = _line_number(a1[1])
    if start is None:
        return (None, None)
    if a2 is None:
        return (start, start)
    if a2[0] == "last":
        return (start, None)
    if a2[0] == "num":
        end = _line_number(a2[1])
        if end is None:
            return (None, None)
        return (start, max(start, end))
    return (None, None)


def _sed(args: list[str]) -> tuple[Any, ...] | None:
    saw_n = False
    scripts: list[str] = []
    operands: list[str] = []
    end_opts = False
    i = 0
    n = len(args)
    while i < n:
        w = args[i]
        i += 1
        if end_opts or w == "-" or not w.startswith("-"):
            operands.append(w)
            continue
        if w == "--":
            end_opts = True
        elif w == "-n":
            saw_n = True
        elif w in ("-e", "--expression"):
            if i >= n:
                return None
            scripts.append(args[i])
            i += 1
        elif w.startswith("--expression="):
            scripts.append(w[len("--expression="):])
        elif w.startswith("-e"):
            scripts.append(w[2:])
        elif w in _SED_FLAGS:
            pass
        elif w in ("-l", "--line-length"):
            i += 1
        elif (w.startswith("-l") and not w.startswith("--")) or w.startswith("--line-length="):
            pass
        else:
            return None
    if not saw_n:
        return None
    if scripts:
        if len(scripts) != 1:
            return None
        script = scripts[0]
        files = operands
    else:
        if not operands:
            return None
        script = operands[0]
        files = operands[1:]
    files = [f for f in files if f != "-"]
    if not files or not files[-1]:
        return None
    rng = _sed_range(script)
    if not isinstance(rng, tuple):
        return None
    op: list[tuple[str, object]] = [("type", "read"), ("path", files[-1])]
    if rng[0] is not None:
        op.append(("startLine", rng[0]))
    if rng[1] is not None:
        op.append(("endLine", rng[1]))
    return (tuple(op),)


_GREP_SHORT_VALUE = frozenset("efmABCdD")
_GREP_LONG_VALUE = frozenset({
    "--regexp", "--file", "--max-count", "--after-context", "--before-context",
    "--context", "--include", "--exclude", "--exclude-dir", "--directories",
    "--devices", "--label", "--binary-files", "--exclude-from",
    "--group-separator",
})
_RG_SHORT_VALUE = frozenset("efgtTmABCMjrEd")
_RG_LONG_VALUE = frozenset({
    "--regexp", "--file", "--glob", "--iglob", "--type", "--type-not",
    "--max-count", "--after-context", "--before-context", "--context",
    "--max-columns", "--threads", "--max-depth", "--max-filesize", "--replace",
    "--pre", "--pre-glob", "--sort", "--sortr", "--encoding", "--color",
    "--colors", "--context-separator", "--dfa-size-limit", "--regex-size-limit",
    "--engine", "--field-context-separator", "--field-match-separator",
    "--path-separator", "--ignore-file", "--type-add", "--type-clear",
    "--hyperlink-format", "--generate",
})
_RG_NO_PATTERN = frozenset({"--files", "--type-list"})


def _search(args: list[str], short_value: frozenset[str], long_value: frozenset[str],
            no_pattern: frozenset[str] = frozenset()) -> tuple[Any, ...] | None:
    e_query: str | None = None
    from_file = False
    operands: list[str] = []
    end_opts = False
    i = 0
    n = len(args)
    while i < n:
        w = args[i]
        i += 1
        if end_opts or w == "-" or not w.startswith("-"):
            operands.append(w)
            continue
        if w == "--":
            end_opts = True
            continue
        if w.startswith("--"):
            name, eq, val = w.partition("=")
            if name in no_pattern:
                return None
            if name not in long_value:
                continue
            if not eq:
                if i >= n:
                    return None
                val = args[i]
                i += 1
            if name == "--regexp":
                if e_query is None:
                    e_query = val
            elif name == "--file":
                from_file = True
            continue
        # short option cluster
        for j in range(1, len(w)):
            c = w[j]
            if c not in short_value:
                continue
            if j + 1 < len(w):
                val = w[j + 1:]
            else:
                if i >= n:
                    return None
                val = args[i]
                i += 1
            if c == "e":
                if e_query is None:
                    e_query = val
            elif c == "f":
                from_file = True
            break
    if e_query is not None:
        query = e_query
        path = operands[0] if operands else None
    elif from_file:
        return None
    else:
        if not operands:
            return None
        query = operands[0]
        path = operands[1] if len(operands) > 1 else None
    if not query:
        return None
    op: list[tuple[str, str]] = [("type", "search"), ("query", query)]
    if path:
        op.append(("path", path))
    return (tuple(op),)


_FIND_NAME_PREDICATES = frozenset({"-name", "-iname", "-path"})
_FIND_GLOBAL_FLAGS = frozenset({"-H", "-L", "-P"})
_FIND_ONE_ARG = frozenset({
    "-type", "-xtype", "-maxdepth", "-mindepth", "-newer", "-anewer", "-cnewer",
    "-user", "-group", "-perm", "-size", "-mtime", "-atime", "-ctime", "-mmin",
    "-amin", "-cmin", "-regex", "-iregex", "-regextype", "-wholename",
    "-iwholename", "-ipath", "-lname", "-ilname", "-samefile", "-inum", "-links",
    "-uid", "-gid", "-used", "-fstype", "-printf", "-fprint", "-fprint0",
    "-fls", "-context", "-files0-from",
})
_FIND_EXEC = frozenset({"-exec", "-execdir", "-ok", "-okdir"})


def _find(args: list[str]) -> tuple[Any, ...] | None:
    n = len(args)
    i = 0
    while i < n:
        w = args[i]
        if w in _FIND_GLOBAL_FLAGS or (w.startswith("-O") and len(w) > 2):
            i += 1
        elif w == "-D":
            i += 2
        else:
            break
    start: str | None = None
    while i < n:
        w = args[i]
        if w[:1] in ("-", "(", "!"):
            break
        if start is None:
            start = w
        i += 1
    query: str | None = None
    while i < n:
        w = args[i]
        i += 1
        if w in _FIND_NAME_PREDICATES:
            if i >= n:
                return None
            query = args[i]
            break
        if w in _FIND_ONE_ARG:
            i += 1
        elif w == "-fprintf":
            i += 2
        elif w in _FIND_EXEC:
            while i < n and args[i] not in (";", "+"):
                i += 1
            i += 1
    if query is None:
        query = start
    if not query:
        return None
    op: list[tuple[str, str]] = [("type", "search"), ("query", query)]
    if start:
        op.append(("path", start))
    return (tuple(op),)


_LS_SHORT_VALUE = frozenset("IwT")
_LS_LONG_VALUE = frozenset({
    "--block-size", "--format", "--hide", "--ignore", "--indicator-style",
    "--quoting-style", "--sort", "--tabsize", "--time", "--time-style",
    "--width",
})


def _ls(args: list[str]) -> tuple[Any, ...]:
    last: str | None = None
    end_opts = False
    i = 0
    n = len(args)
    while i < n:
        w = args[i]
        i += 1
        if end_opts or w == "-" or not w.startswith("-"):
            last = w
            continue
        if w == "--":
            end_opts = True
        elif w.startswith("--"):
            if "=" not in w and w in _LS_LONG_VALUE:
                i += 1
        else:
            for j in range(1, len(w)):
                if w[j] in _LS_SHORT_VALUE:
                    if j + 1 == len(w):
                        i += 1
                    break
    if last:
        return ((("type", "list"), ("path", last)),)
    return ((("type", "list"),),)


_SHELLS = frozenset({"bash", "sh"})
_SHELL_LONG_VALUE = frozenset({"--rcfile", "--init-file"})


def _shell_script(args: list[str]) -> str | None:
    """The SCRIPT of ``bash``/``sh`` args if one of its flags has ``c``."""
    saw_c = False
    i = 0
    n = len(args)
    while i < n:
        w = args[i]
        if w in ("--", "-"):
            i += 1
            break
        if w.startswith("--"):
            i += 2 if w in _SHELL_LONG_VALUE else 1
            continue
        if len(w) > 1 and w[0] in "-+":
            if w[0] == "-" and "c" in w:
                saw_c = True
            i += 2 if w[-1] in "oO" else 1
            continue
        break
    if not saw_c or i >= n:
        return None
    return args[i]


def _classify(command: str, unwrap: bool = True) -> tuple[Any, ...] | None:
    parsed = first_simple_command(command)
    if parsed is None:
        return None
    words, redirects = parsed
    k = 0
    while k < len(words):
        text, lit = words[k]
        m = ASSIGN_RE.match(text)
        if m is None or m.end() > lit:
            break
        k += 1
    if k >= len(words):
        return None
    prog = words[k][0].rpartition("/")[2]
    args = [w[0] for w in words[k + 1:]]
    if prog == "cat":
        return _cat(args, redirects)
    if prog == "sed":
        return _sed(args)
    if prog == "grep":
        return _search(args, _GREP_SHORT_VALUE, _GREP_LONG_VALUE)
    if prog == "rg":
        return _search(args, _RG_SHORT_VALUE, _RG_LONG_VALUE, _RG_NO_PATTERN)
    if prog == "find":
        return _find(args)
    if prog == "ls":
        return _ls(args)
    if unwrap and prog in _SHELLS:
        script = _shell_script(args)
        if script is None:
            return None
        return _classify(script, unwrap=False)
    return None


_CACHE_MAX_LEN = 8192


@lru_cache(maxsize=4096)
def _kinds_cached(command: str) -> tuple[Mapping[str, Any], ...] | None:
    ops = _classify(command)
    return tuple(dict(op) for op in ops) if ops else None


def shell_kinds(command: str) -> tuple[Mapping[str, Any], ...] | None:
    """:func:`classify_shell` for callers that only read the result (the normalizer copies each
    kind into its event): the same operations, shared between calls, so never to be mutated."""
    try:
        if len(command) <= _CACHE_MAX_LEN:
            return _kinds_cached(command)
        ops = _classify(command)
        return tuple(dict(op) for op in ops) if ops else None
    except Exception:  # pragma: no cover - defensive: the contract is "never raises"
        return None


def classify_shell(command: object) -> list[dict[str, Any]] | None:
    """None: the command is a plain `command` event (caller emits it with the original untouched string).
    Otherwise a non-empty list of file-operation dicts, in order, each one of:
      {"type": "read", "path": str, "startLine"?: int, "endLine"?: int}
      {"type": "write", "path": str}
      {"type": "search", "query": str, "path"?: str}
      {"type": "list", "path"?: str}
    Optional keys are omitted (never None). The dicts are the caller's own."""
    if not isinstance(command, str) or not command:
        return None
    kinds = shell_kinds(command)
    return None if kinds is None else [dict(kind) for kind in kinds]
