"""Tests for services.normalizer.shell.classify_shell (contract section 3.6)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.normalizer import shell
from services.normalizer.shell import classify_shell
from tests.support.scaling import assert_scales_linearly


def R(path, start=None, end=None):
    op = {"type": "read", "path": path}
    if start is not None:
        op["startLine"] = start
    if end is not None:
        op["endLine"] = end
    return op


def W(path):
    return {"type": "write", "path": path}


def S(query, path=None):
    op = {"type": "search", "query": query}
    if path is not None:
        op["path"] = path
    return op


def L(path=None):
    return {"type": "list"} if path is None else {"type": "list", "path": path}


CASES = [
    # --- cat: reads ---------------------------------------------------------
    ("cat a.py", [R("a.py")]),
    ("cat a.py b.py", [R("a.py"), R("b.py")]),
    ("cat -n file", [R("file")]),
    ("cat -n a.py b.py", [R("a.py"), R("b.py")]),
    ("cat --number a", [R("a")]),
    ("cat - a", [R("a")]),  # lone '-' is stdin: ignored
    ("cat -- -weird", [R("-weird")]),  # '--' ends options
    ("cat", None),  # no operands, no redirect
    ("cat -", None),
    ("cat -n", None),
    ('cat ""', None),  # empty required path
    ("cat a > b", [R("a")]),  # operands AND output redirect -> reads only
    ("cat a 2>/dev/null", [R("a")]),
    ("cat < in.txt", None),  # input redirect only: no operand, no write
    # --- cat: writes --------------------------------------------------------
    ("cat > f", [W("f")]),
    ("cat >> log.txt", [W("log.txt")]),
    ("cat >| f", [W("f")]),
    ("cat &> f", [W("f")]),
    ("cat 1> f", [W("f")]),
    ("cat > a > b", [W("b")]),  # last stdout redirect wins
    ("cat 2> err", None),  # stderr is not the written content
    ("cat >&2", None),  # fd duplication, not a file
    ("cat - > f", [W("f")]),
    ("cat <<EOF > f\nline 1\nline 2\nEOF\n", [W("f")]),
    ("cat > f <<'EOF'\nhello 'unbalanced\nEOF", [W("f")]),
    ("cat <<-EOF >out.txt\n\tx\n\tEOF", [W("out.txt")]),
    ("cat <<EOF\nno redirect\nEOF", None),
    ("cat <<< 'here string'", None),
    ("cat >", None),  # redirect without target: malformed
    ("cat > ; ls", None),
    # --- quoting / escaping ---------------------------------------------------
    ('cat "my file.txt"', [R("my file.txt")]),
    ("cat 'a b'", [R("a b")]),
    ("cat a\\ b", [R("a b")]),
    ('cat "a\\"b"', [R('a"b')]),
    ("cat 'a\\b'", [R("a\\b")]),
    ('cat "a\\nb"', [R("a\\nb")]),  # \n is not an escape inside "..."
    ("cat $'a\\tb'", [R("a\tb")]),
    ('cat $"x y"', [R("x y")]),
    ("cat 'a'\"b\"c", [R("abc")]),
    ("cat \"a", [R("a")]),  # unbalanced double quote: rest of string
    ("cat 'a b", [R("a b")]),  # unbalanced single quote: rest of string
    ("cat 'a;b|c'", [R("a;b|c")]),
    ("cat a\\", [R("a\\")]),  # trailing lone backslash kept
    ("cat \\\n  a", [R("a")]),  # line continuation
    ("cat $HOME/x", [R("$HOME/x")]),  # not expanded
    ("cat $(ls | head -1)", [R("$(ls | head -1)")]),
    ("cat `ls; pwd` z", [R("`ls; pwd`"), R("z")]),
    ("cat ${DIR}/f", [R("${DIR}/f")]),
    ("cat ./src/../a.py", [R("./src/../a.py")]),  # paths not normalized
    ("cat a#b", [R("a#b")]),
    ("cat a # comment b", [R("a")]),
    ("# just a comment", None),
    ("cat\ta.py\r\n", [R("a.py")]),
    # --- glued operators / first simple command --------------------------------
    ("cat a>b", [R("a")]),
    ("ls|wc -l", [L()]),
    ("cat a;rm b", [R("a")]),
    ("cat a&&rm b", [R("a")]),
    ("cat a||true", [R("a")]),
    ("cat a&", [R("a")]),
    ("cat a|&tee x", [R("a")]),
    ("cat a\nrm b", [R("a")]),
    ("cat a 2>&1|head", [R("a")]),
    ("\n cat a", [R("a")]),
    ("# header\n\ncat a", [R("a")]),
    ("; cat a", None),
    ("&& cat a", None),
    ("(cat a)", None),
    ("{ cat a; }", None),
    ("cat <(ls)", None),
    ("", None),
    ("   \t ", None),
    ("\n\n", None),
    # --- program basename / assignments ----------------------------------------
    ("/usr/bin/cat x", [R("x")]),
    ("/bin/ls /tmp", [L("/tmp")]),
    ("LC_ALL=C grep x f", [S("x", "f")]),
    ("A=1 B+=2 cat f", [R("f")]),
    ("FOO=$(pwd) cat f", [R("f")]),
    ("FOO=1", None),
    ('"FOO=1" cat f', None),  # quoted: not an assignment, program is "FOO=1"
    ('"cat" f', [R("f")]),
    ("\\cat f", [R("f")]),
    ("CAT f", None),
    ("> out cat a", [R("a")]),  # redirect before the program
    # --- sed -n -------------------------------------------------------------------
    ("sed -n 10,20p src/x.py", [R("src/x.py", 10, 20)]),
    ("sed -n '5p' f", [R("f", 5, 5)]),
    ("sed -n '3,$p' f", [R("f", 3)]),
    ("sed -n '/a/,/b/p' f", [R("f")]),
    ("sed -n '/foo/p' f", [R("f")]),
    ("sed -n '\\%x/y%p' f", [R("f")]),
    ("sed -n '5,/end/p' f", [R("f")]),
    ("sed -n '$p' f", [R("f")]),
    ("sed -n 1,5p a b", [R("b", 1, 5)]),
    ("sed -n -e '1,5p' f", [R("f", 1, 5)]),
    ("sed -n -e1,5p f", [R("f", 1, 5)]),
    ("sed -n --expression=2,3p f", [R("f", 2, 3)]),
    ("sed -E -n 2p f", [R("f", 2, 2)]),
    ("sed -n ' 1 , 4 p ' f", [R("f", 1, 4)]),
    ("sed -n 20,10p f", [R("f", 20, 20)]),  # B < A: sed prints only line A
    ("sed -n 0,5p f", [R("f")]),  # 0 -> no lines
    ("sed -n 0p f", [R("f")]),
    ("sed -n 007,010p f", [R("f", 7, 10)]),
    ("sed -n 1234567890123456789p f", [R("f")]),  # too long -> no lines
    ("sed -n 1,5p", None),  # no file
    ("sed -n 1,5p -", None),  # stdin only
    ("sed -n", None),
    ("sed 1,5p f", None),  # no -n
    ("sed -ne 1,5p f", None),  # -n not its own word
    ("sed -n -i 1,5p f", None),
    ("sed --quiet 1,5p f", None),  # only the literal -n word counts
    ("sed -n -f script.sed f", None),
    ("sed -i s/a/b/ f", None),
    ("sed -n 1,5d f", None),  # not a print range
    ("sed -n p f", None),
    ("sed -n '1,5p;q' f", None),
    ("sed -n 1~2p f", None),
    ("sed -n -e 1p -e 2p f", None),  # more than one script
    ("sed -n 1,5p ''", None),  # empty file path
    # --- grep -----------------------------------------------------------------
    ('grep -rn "TODO" src/', [S("TODO", "src/")]),
    ("grep foo", [S("foo")]),
    ("grep foo a b", [S("foo", "a")]),
    ("grep -A 3 -e foo bar.txt", [S("foo", "bar.txt")]),
    ("grep -A3 foo bar.txt", [S("foo", "bar.txt")]),
    ("grep -rA 3 foo dir", [S("foo", "dir")]),
    ("grep -m 5 foo f", [S("foo", "f")]),
    ("grep -efoo f", [S("foo", "f")]),
    ("grep --regexp=foo f", [S("foo", "f")]),
    ("grep --regexp foo f", [S("foo", "f")]),
    ("grep -e a -e b f", [S("a", "f")]),  # first -e wins
    ("grep --include '*.py' -r foo .", [S("foo", ".")]),
    ("grep --include=*.py foo .", [S("foo", ".")]),
    ("grep --exclude-dir node_modules foo .", [S("foo", ".")]),
    ("grep --color foo f", [S("foo", "f")]),  # --color takes a value only with '='
    ("grep --color=always foo f", [S("foo", "f")]),
    ("grep -C 2 foo f", [S("foo", "f")]),
    ("grep -B1 foo f", [S("foo", "f")]),
    ("grep foo f -n", [S("foo", "f")]),  # options after operands
    ("grep -- -foo f", [S("-foo", "f")]),
    ("grep -f pats.txt src", None),  # pattern from a file
    ("grep -e foo -f pats.txt src", [S("foo", "src")]),
    ("grep", None),
    ("grep -rn", None),
    ('grep "" f', None),  # empty query
    ("grep foo ''", [S("foo")]),  # empty optional path omitted
    ("grep foo -A", None),  # value option without value
    ("grep -E 'a|b' f", [S("a|b", "f")]),
    # --- rg -------------------------------------------------------------------
    ("rg -n foo src", [S("foo", "src")]),
    ("rg --glob '*.py' pattern dir", [S("pattern", "dir")]),
    ("rg -g '*.py' pattern", [S("pattern")]),
    ("rg -t py -T js foo", [S("foo")]),
    ("rg --type=py foo src", [S("foo", "src")]),
    ("rg -M 200 -j 4 foo", [S("foo")]),
    ("rg -r bar foo f", [S("foo", "f")]),
    ("rg -E latin1 foo f", [S("foo", "f")]),
    ("rg --max-depth 2 foo .", [S("foo", ".")]),
    ("rg -d 2 foo .", [S("foo", ".")]),
    ("rg --sort path foo", [S("foo")]),
    ("rg --color never foo", [S("foo")]),
    ("rg --iglob '*.md' --pre cat foo", [S("foo")]),
    ("rg -e foo src", [S("foo", "src")]),
    ("rg", None),
    ("rg -n", None),
    ("rg --files", None),
    ("rg --files src", None),
    ("rg --files-with-matches foo", [S("foo")]),
    # --- find -----------------------------------------------------------------
    ("find . -name '*.py'", [S("*.py", ".")]),
    ("find src -type f", [S("src", "src")]),
    ("find src", [S("src", "src")]),
    ("find -name x", [S("x")]),
    ("find . -iname '*.MD'", [S("*.MD", ".")]),
    ("find . -path './a/*'", [S("./a/*", ".")]),
    ("find . -type f -name a -name b", [S("a", ".")]),  # first one
    ("find -L src -name x", [S("x", "src")]),
    ("find a b -name x", [S("x", "a")]),
    ("find . ( -name a -o -name b )", None),  # unescaped '(' is an operator
    ("find . \\( -name a -o -name b \\)", [S("a", ".")]),
    ("find . ! -name x", [S("x", ".")]),
    ("find . -exec grep -name {} \\; -name real", [S("real", ".")]),
    ("find . -exec rm {} ; -name x", [S(".", ".")]),  # unescaped ; ends the command
    ("find . -newer -name", [S(".", ".")]),  # -newer's value is not -name
    ("find", None),
    ("find -type f", None),
    ("find . -name", None),
    ("find . -name ''", None),
    ("find '' -name x", [S("x")]),  # empty start path omitted
    # --- ls -------------------------------------------------------------------
    ("ls", [L()]),
    ("ls -la", [L()]),
    ("ls src", [L("src")]),
    ("ls -la src tests", [L("tests")]),
    ("ls src -I '*.pyc'", [L("src")]),
    ("ls --ignore '*.pyc' src", [L("src")]),
    ("ls --sort=time src", [L("src")]),
    ("ls -- -x", [L("-x")]),
    ("ls -", [L("-")]),
    ("ls ''", [L()]),  # empty optional path omitted
    # --- bash / sh unwrap -----------------------------------------------------
    ("bash -lc 'sed -n 10,20p src/x.py'", [R("src/x.py", 10, 20)]),
    ('sh -c "rg -n foo src"', [S("foo", "src")]),
    ("bash -x -c 'ls'", [L()]),
    ("bash -l -c 'cat a'", [R("a")]),
    ("bash -ic 'cat a'", [R("a")]),
    ("bash -euc 'cat a'", [R("a")]),
    ("bash -o pipefail -c 'cat a'", [R("a")]),
    ("bash --norc -c 'cat a'", [R("a")]),
    ("/bin/bash -c 'cat a' && echo done", [R("a")]),
    ("bash -c 'cat a' > out.txt", [R("a")]),
    ("bash -c 'cd x && cat y'", None),
    ("bash -c \"cat > f <<'EOF'\nbody\nEOF\"", [W("f")]),
    ("bash -c 'bash -c \"cat a\"'", None),  # one level only
    ("bash -c", None),
    ("bash -c ''", None),
    ("bash -l", None),
    # --- anything else -> plain command ------------------------------------------
    ("cd /x && cat y", None),
    ("head -n 5 a.py", None),
    ("tail a.py", None),
    ("npm test", None),
    ("bash script.sh", None),
    ("sh script.sh", None),
    ("zsh -c 'cat a'", None),
    ("env bash -c 'cat a'", None),
    ("sudo cat /etc/hosts", None),
    ("time cat a", None),
    ("echo hi > f", None),
    ("python -c 'print(1)'", None),
    ("! cat a", None),
]


@pytest.mark.parametrize(("command", "expected"), CASES, ids=[repr(c)[:60] for c, _ in CASES])
def test_classify(command, expected):
    assert classify_shell(command) == expected


def test_case_count():
    assert len(CASES) >= 60


def test_results_are_fresh_objects():
    first = classify_shell("cat a b")
    first[0]["path"] = "mutated"
    first.append({"type": "bogus"})
    assert classify_shell("cat a b") == [R("a"), R("b")]
    assert classify_shell("cat a b") is not classify_shell("cat a b")


@pytest.mark.parametrize("value", [None, 42, b"cat a", ["cat", "a"]])
def test_non_string_input_returns_none(value):
    assert classify_shell(value) is None


def test_long_command_bypasses_cache_and_works():
    path = "x" * 20000
    assert classify_shell(f"cat {path}") == [R(path)]


# Each pathological command as a function of its size: the full size must not raise, and twice
# the work must not take more than about twice the time (tests/support/scaling.py).
_HUGE: dict[str, tuple[Callable[[int], str], int]] = {
    "quotes": (lambda n: "cat " + "'" * n, 200_001),
    "double quotes": (lambda n: "cat " + '"' * n, 200_001),
    "command substitutions": (lambda n: "cat " + "$(" * n, 200_000),
    "parameter expansions": (lambda n: "cat " + "${" * n, 200_000),
    "backticks": (lambda n: "cat " + "`" * n, 200_001),
    "backslashes": (lambda n: "cat " + "\\" * n, 200_001),
    "one long word": (lambda n: "cat " + "a" * n, 1_000_000),
    "many words": (lambda n: "cat " + "a " * n, 300_000),
    "nested bash -c": (lambda n: "bash -c " + "'" + "$(" * n, 100_000),
    "sed address": (lambda n: "sed -n " + "1" * n + "p f", 100_000),
    "sed regex": (lambda n: "sed -n '/" + "\\/" * n + "' f", 100_000),
    "grep options": (lambda n: "grep " + "-e " * n, 100_000),
    "find actions": (lambda n: "find . " + "-exec " * n, 100_000),
    "newlines": (lambda n: "\n" * n + "cat a", 500_000),
    "NULs": (lambda n: "cat a" + "\x00" * n, 100_000),
}


@pytest.mark.parametrize("name", list(_HUGE))
def test_huge_inputs_do_not_raise(name):
    make, n = _HUGE[name]
    _check_shape(classify_shell(make(n)))


@pytest.mark.parametrize("name", list(_HUGE))
def test_huge_inputs_take_linear_time(name):
    make, n = _HUGE[name]
    assert_scales_linearly(classify_shell, make, n // 4)


def _check_shape(result):
    assert result is None or (isinstance(result, list) and result)
    for op in result or ():
        assert isinstance(op, dict)
        assert op["type"] in {"read", "write", "search", "list"}
        for key, value in op.items():
            assert value is not None
            assert isinstance(key, str)
            assert type(value) in (str, int)
        if op["type"] in ("read", "write"):
            assert set(op) <= {"type", "path", "startLine", "endLine"}
            assert op["path"]
        elif op["type"] == "search":
            assert set(op) <= {"type", "query", "path"}
            assert op["query"]
        else:
            assert set(op) <= {"type", "path"}


_SHELLISH = st.lists(
    st.sampled_from(
        list(" \t\n\r\\'\"`$(){}<>|&;#!=-,/~*?0123456789abcnpelsrgfd")
        + ["cat ", "sed -n ", "rg ", "grep ", "find ", "ls ", "bash -c ", "sh -lc ",
           "-e ", "-name ", "<<EOF", "2>&1", "&>", "$'", "1,5p", "/x/", "\x00", "é", "🦆"]
    ),
    max_size=60,
).map("".join)


@settings(max_examples=600, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.one_of(st.text(), _SHELLISH, st.text(alphabet=st.characters(max_codepoint=0x7F))))
def test_never_raises(command):
    # The private uncached core must be exception-free on its own (the public
    # function's try/except is only a last-resort guard).
    shell._classify(command)
    _check_shape(classify_shell(command))


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(["cat", "sed -n", "rg", "grep", "find", "ls", "bash -c", "sh -lc"]),
    st.lists(st.text(), max_size=6),
)
def test_never_raises_program_with_random_args(program, args):
    command = " ".join([program, *args])
    shell._classify(command)
    _check_shape(classify_shell(command))
