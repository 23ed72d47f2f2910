"""The shell tokenizer of contract 3.6: a command string -> the words and redirections of its
first simple command. ``shell`` classifies that command by its program; this module knows no
program.

Pure, stdlib-only, linear-time and never raising; tokenizing is lazy (it stops at the end of the
first simple command). Skipping leading assignments (``ASSIGN_RE``) and taking the program's
basename are ``shell``'s, which reads the words this module returns. Decisions taken where the
contract is silent (each one has a test in
tests/core/test_shell_classify.py):

Tokenizer
  * Blanks are space, tab, CR, FF and VT (CR is treated as a blank so CRLF
    input does not leak ``\\r`` into paths); newline is a command separator.
  * Quotes: ``'...'`` literal; ``"..."`` with ``\\`` escaping only
    ``" \\ $ ` newline``; ``$'...'`` ANSI-C quoting with the common escapes
    decoded (unknown escapes are kept verbatim); ``$"..."`` like ``"..."``.
    An unbalanced quote takes the rest of the string as the quoted text.
  * Backslash outside quotes escapes the next character; backslash-newline is
    a line continuation; a trailing lone backslash is kept literally.
  * ``$(...)``, ``$((...))``, ``${...}`` and backquotes are kept verbatim
    inside the word (operators inside them do not split the command); an
    unterminated one runs to the end of the string.
  * ``#`` at the start of a word starts a comment up to the newline.
  * Operators (also when glued to words): ``&& || ; ;; ;& ;;& | |& & ( )``
    and the redirections ``< > >> >| <> <& >& &> &>> << <<- <<<``.  A run of
    unquoted ASCII digits glued before ``<``/``>`` is the redirection's fd
    (``2>err``), not a word.

First simple command
  * Leading blank lines / comment lines are skipped (``"\\n cat a"`` reads
    ``a``); any other leading operator (``; cat a``) is a syntax error → None.
  * It ends at newline, ``&&``, ``||``, ``;``, ``;;``, ``|``, ``|&``, ``&``.
  * ``(`` or ``)`` anywhere in it (subshell, process substitution
    ``<(...)``, function definitions) → None.  ``{`` as the program is simply
    an unknown program → None.
  * Every redirection consumes the next word as its target (not an operand);
    a redirection without a word target (``cat >``, ``cat > ;``) → None.
    Heredoc delimiters (``<<EOF``, ``<<-EOF``, ``<<'EOF'``) are such targets;
    the heredoc body follows a newline and so is never part of the command.
  * Leading ``NAME=value`` / ``NAME+=value`` words (name and ``=`` unquoted)
    are assignments and are skipped: ``LC_ALL=C grep x f`` is a search.
    Only assignments (no program) → None.
  * Program basename is the text after the last ``/``: ``/usr/bin/cat`` →
    ``cat``.  Programs are case-sensitive (``CAT`` is not ``cat``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

_BLANKS = frozenset(" \t\r\f\v")
_OP_START = frozenset("|&;<>()")

# Longest operators first: regex alternation takes the first that matches.
_OP_RE = re.compile(
    r"&>>|<<<|<<-|;;&|&&|&>|\|\||\|&|;;|;&|<<|<&|<>|>>|>&|>\||[&|;<>()]"
)
# A run of characters that are literal inside an unquoted word.
_WORD_RUN_RE = re.compile(r"[^ \t\r\f\v\n|&;<>()'\"\\`$]+")
# A run of characters that are literal inside double quotes.
_DQ_RUN_RE = re.compile(r'[^"\\`$]+')
# Bodies of quoted constructs, with backslash escapes (unrolled loop).
_SQ_ESC_BODY_RE = re.compile(r"[^'\\]*(?:\\.[^'\\]*)*", re.S)
_DQ_BODY_RE = re.compile(r'[^"\\]*(?:\\.[^"\\]*)*', re.S)
_BQ_BODY_RE = re.compile(r"[^`\\]*(?:\\.[^`\\]*)*", re.S)
_PAREN_RUN_RE = re.compile(r"[^\\'\"()]+")
_BRACE_RUN_RE = re.compile(r"[^\\'\"{}]+")
_ANSI_ESC_RE = re.compile(r"\\(.)", re.S)
_ANSI_ESCAPES = {
    "n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "f": "\f",
    "v": "\v", "e": "\x1b", "E": "\x1b", "\\": "\\", "'": "'", '"': '"',
    "?": "?",
}

ASSIGN_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\+?=")
DIGITS_RE = re.compile(r"[0-9]+\Z")

_TERMINATORS = frozenset({"\n", "&&", "||", ";", ";;", ";&", ";;&", "|", "|&", "&"})
_REDIRECTS = frozenset({"<", ">", ">>", ">|", "<>", "<&", ">&", "&>", "&>>", "<<", "<<-", "<<<"})

_WORD = 0
_OP = 1


def _ansi_c(body: str) -> str:
    return _ANSI_ESC_RE.sub(lambda m: _ANSI_ESCAPES.get(m.group(1), m.group(0)), body)


def _must(m: re.Match[str] | None) -> re.Match[str]:
    """The match of a pattern that matches everywhere (it may match the empty string)."""
    assert m is not None
    return m


def _skip_dq(s: str, j: int) -> int:
    """``s[j-1]`` is ``"``; return the index after the closing quote (or len)."""
    m = _must(_DQ_BODY_RE.match(s, j))
    e = m.end()
    return e + 1 if e < len(s) and s[e] == '"' else len(s)


def _skip_bq(s: str, j: int) -> int:
    """``s[j-1]`` is a backquote; return the index after its closer (or len)."""
    m = _must(_BQ_BODY_RE.match(s, j))
    e = m.end()
    return e + 1 if e < len(s) and s[e] == "`" else len(s)


def _skip_nested(s: str, j: int, run_re: re.Pattern[str], open_c: str, close_c: str) -> int:
    """Skip a ``$(``/``${`` body starting at ``j`` (after the opener); iterative."""
    n = len(s)
    depth = 1
    while j < n:
        m = run_re.match(s, j)
        if m:
            j = m.end()
            if j >= n:
                break
        c = s[j]
        if c == "\\":
            j += 2
        elif c == "'":
            k = s.find("'", j + 1)
            j = n if k < 0 else k + 1
        elif c == '"':
            j = _skip_dq(s, j + 1)
        elif c == open_c:
            depth += 1
            j += 1
        elif c == close_c:
            depth -= 1
            j += 1
            if depth == 0:
                return j
        else:  # the other bracket kind: literal here
            j += 1
    return n


def _skip_dollar(s: str, i: int) -> int:
    """``s[i]`` is ``$``: return the end of a ``$(``/``${`` construct, or -1."""
    nxt = s[i + 1] if i + 1 < len(s) else ""
    if nxt == "(":
        return _skip_nested(s, i + 2, _PAREN_RUN_RE, "(", ")")
    if nxt == "{":
        return _skip_nested(s, i + 2, _BRACE_RUN_RE, "{", "}")
    return -1


def _tokens(s: str) -> Iterator[tuple[Any, ...]]:
    """Lazily yield ``(_WORD, text, literal_prefix_len)`` / ``(_OP, op, fd)``.

    ``literal_prefix_len`` is how many leading characters of ``text`` came from
    unquoted, unescaped, unexpanded source (used to recognise assignments and
    fd numbers, which must not be quoted).
    """
    n = len(s)
    i = 0
    while i < n:
        c = s[i]
        if c in _BLANKS:
            i += 1
            continue
        if c == "\n":
            yield (_OP, "\n", None)
            i += 1
            continue
        if c == "#":
            k = s.find("\n", i)
            if k < 0:
                return
            i = k
            continue
        if c in _OP_START:
            m = _must(_OP_RE.match(s, i))
            i = m.end()
            yield (_OP, m.group(), None)
            continue

        # A word.
        parts: list[str] = []
        length = 0
        quoted_at = -1  # length at the first non-literal part, -1 if none
        in_word = False
        fd_redirect = None
        while i < n:
            c = s[i]
            if c in _BLANKS or c == "\n":
                break
            if c in _OP_START:
                if c in "<>" and in_word and quoted_at < 0:
                    word = "".join(parts)
                    if DIGITS_RE.match(word):
                        m = _must(_OP_RE.match(s, i))
                        i = m.end()
                        fd_redirect = (_OP, m.group(), word)
                break
            if c == "'":
                k = s.find("'", i + 1)
                end = n if k < 0 else k
                piece = s[i + 1:end]
                i = end + 1
                if quoted_at < 0:
                    quoted_at = length
                parts.append(piece)
                length += len(piece)
                in_word = True
                continue
            if c == '"':
                if quoted_at < 0:
                    quoted_at = length
                in_word = True
                i += 1
                while i < n:
                    d = s[i]
                    if d == '"':
                        i += 1
                        break
                    if d == "\\":
                        nx = s[i + 1] if i + 1 < n else ""
                        if nx == "\n":
                            i += 2
                            continue
                        if nx and nx in '"\\$`':
                            parts.append(nx)
                            length += 1
                            i += 2
                            continue
                        parts.append("\\")
                        length += 1
                        i += 1
                        continue
                    if d == "$":
                        e = _skip_dollar(s, i)
                        if e < 0:
                            e = i + 1
                    elif d == "`":
                        e = _skip_bq(s, i + 1)
                    else:
                        e = _must(_DQ_RUN_RE.match(s, i)).end()
                    parts.append(s[i:e])
                    length += e - i
                    i = e
                continue
            if c == "\\":
                nx = s[i + 1] if i + 1 < n else ""
                if nx == "\n":  # line continuation
                    i += 2
                    continue
                if quoted_at < 0:
                    quoted_at = length
                piece = nx if nx else "\\"
                parts.append(piece)
                length += 1
                i += 2
                in_word = True
                continue
            if c == "$":
                nx = s[i + 1] if i + 1 < n else ""
                if nx == "'":
                    m = _must(_SQ_ESC_BODY_RE.match(s, i + 2))
                    e = m.end()
                    piece = _ansi_c(s[i + 2:e])
                    i = e + 1 if e < n else n
                elif nx == '"':
                    # $"..." (locale translation): treated as "..." next round.
                    i += 1
                    continue
                else:
                    e = _skip_dollar(s, i)
                    if e < 0:
                        e = i + 1
                    piece = s[i:e]
                    i = e
                if quoted_at < 0:
                    quoted_at = length
                parts.append(piece)
                length += len(piece)
                in_word = True
                continue
            if c == "`":
                e = _skip_bq(s, i + 1)
                if quoted_at < 0:
                    quoted_at = length
                parts.append(s[i:e])
                length += e - i
                i = e
                in_word = True
                continue
            m = _must(_WORD_RUN_RE.match(s, i))
            e = m.end()
            parts.append(s[i:e])
            length += e - i
            i = e
            in_word = True
        if fd_redirect is not None:
            yield fd_redirect
        elif in_word:
            yield (_WORD, "".join(parts), length if quoted_at < 0 else quoted_at)


def first_simple_command(s: str) -> tuple[list[tuple[str, int]], list[tuple[Any, ...]]] | None:
    """Return ``(words, redirects)`` of the first simple command, or None.

    ``words`` is a list of ``(text, literal_prefix_len)``; ``redirects`` a list
    of ``(op, fd, target)``.
    """
    words: list[tuple[str, int]] = []
    redirects: list[tuple[str, str | None, str]] = []
    toks = _tokens(s)
    for tok in toks:
        if tok[0] == _WORD:
            words.append((tok[1], tok[2]))
            continue
        op = tok[1]
        if op in _REDIRECTS:
            target = next(toks, None)
            if target is None or target[0] != _WORD:
                return None
            redirects.append((op, tok[2], target[1]))
            continue
        if op == "\n" and not words and not redirects:
            continue  # empty leading line
        if op in _TERMINATORS:
            break
        return None  # ( or )
    return words, redirects
