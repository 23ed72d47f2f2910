"""The compiled core (``services/native.py``, built by ``setup.py`` with mypyc) against the Python
core it is compiled from: the same procedures on the same cases give identical bytes.

This process runs the compiled core; ``tests/support/pure_core.py`` runs beside it with
``GOOSE_INGEST_PURE_PYTHON=1`` and answers for the Python core. Under CI the compiled core must be
there (``.ci/run`` installs with the README's command, on a machine with a C compiler).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tests.core.test_error_classes as error_class_cases
import tests.core.test_normalizer_properties_formats as formats_props
import tests.core.test_provider_error_texts as provider_texts
import tests.core.test_redaction as redaction_props
from services import native
from tests.support import core_cases
from tests.support.fixtures import SHARED, transcript_lines
from tests.support.needs import missing
from tests.support.pipeline import REPO

FORMAT_TRANSCRIPTS = [(p.parent.name, transcript_lines(p)) for p in sorted((SHARED / "fixtures").glob("*/*.jsonl"))]
SECRET_LINES = [
    '{"type":"message","message":{"role":"assistant","content":[{"type":"text","text":"key AKIAIOSFODNN7EXAMPLE"}]}}',
    "export GITHUB_TOKEN=ghp_abcdefghijklmnopqrstuvwxyz0123456789",
    '{"password": "hunter2hunter2", "user": "x", "nested": [{"name": "DB_PASSWORD", "value": "s3cr3t-v4lue-123"}]}',
    "-----BEGIN RSA PRIVATE KEY-----",
    "MIIEowIBAAKCAQEAzZ9f0123456789abcdefghijklmnopqrstuvwxyzABCDEFGH",
    "-----END RSA PRIVATE KEY-----",
    "curl -u deploy:Zx81kQ0pLmN7vB3c https://x.example.com",
    "not json at all",
]


def _pure_env() -> dict[str, str]:
    return {**os.environ, native.PURE_ENV: "1"}


@pytest.fixture(scope="module")
def compiled() -> None:
    if native.pure_requested():
        missing("the compiled core in the test process", f"unset {native.PURE_ENV}")
    if native.core_kind() != "compiled":
        missing("the compiled core", "pip install -e . on a machine with a C compiler builds it (setup.py)")


@pytest.fixture(scope="module")
def reference(compiled):
    proc = subprocess.Popen([sys.executable, "-m", "tests.support.pure_core"], cwd=REPO, env=_pure_env(),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    hello = json.loads(proc.stdout.readline())
    assert hello == {"core": "pure"}, hello

    def ask(op: str, case: object) -> tuple[bytes, bytes]:
        """(compiled bytes, Python bytes) of one procedure on one case."""
        case = json.loads(json.dumps(case))  # exactly what the other side receives
        proc.stdin.write(json.dumps({"op": op, "case": case}).encode() + b"\n")
        proc.stdin.flush()
        theirs = proc.stdout.readline().rstrip(b"\n")
        return core_cases.run(op, case), theirs

    yield ask
    proc.stdin.close()
    proc.wait(timeout=30)


# ----------------------------------------------------------------------------- how it is loaded
def test_every_core_module_runs_compiled(compiled):
    for name in native.COMPILED_MODULES:
        module = sys.modules[name]
        assert not module.__file__.endswith(".py"), f"{name} runs from {module.__file__}"


def test_the_switch_runs_every_core_module_from_its_python_file():
    code = ("import sys; from services import native; print(native.core_kind()); "
            "print(all(sys.modules[n].__file__.endswith('.py') for n in native.COMPILED_MODULES))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=_pure_env(), capture_output=True, text=True,
                         check=True)
    assert out.stdout.split() == ["pure", "True"]
    assert out.stderr == ""


def test_a_build_older_than_its_sources_is_not_run(tmp_path: Path):
    """An edit after the last build (an editable install compiles beside the sources): the stale
    build would run code that is no longer in the source."""
    name = native.COMPILED_MODULES[0]
    source = tmp_path / (name.replace(".", "/") + ".py")
    source.parent.mkdir(parents=True)
    source.write_text("")
    built = tmp_path / f"{native.GROUP_NAME}__mypyc.cpython-311-x86_64-linux-gnu.so"
    built.write_bytes(b"")
    now = time.time()
    os.utime(source, (now - 100, now - 100))
    os.utime(built, (now, now))
    assert native.stale_modules(tmp_path) == []
    os.utime(source, (now + 10, now + 10))
    assert native.stale_modules(tmp_path) == [name]
    built.unlink()
    assert native.stale_modules(tmp_path) == []  # nothing built: nothing stale


def test_a_stale_build_falls_back_to_python_with_one_line_on_stderr(tmp_path: Path):
    code = ("import sys; from pathlib import Path; import services.native as n; "
            "n.stale_modules = lambda root=None: [n.COMPILED_MODULES[0]]; n.choose_core(); "
            "import services.normalizer.timefmt as m; print(m.__file__.endswith('.py'))")
    env = {k: v for k, v in os.environ.items() if k != native.PURE_ENV}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True"]
    assert len(out.stderr.splitlines()) == 1 and "older than services/normalizer/timefmt.py" in out.stderr


# ----------------------------------------------------------------------------- identical bytes
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(formats_props.runs, formats_props.formats, formats_props.labels,
       st.sampled_from([[262_144, 256], [24, 3], [1, 1]]), st.lists(st.integers(0, 30), max_size=3),
       st.none() | st.integers(-3, 300))
def test_the_normalizer_gives_the_same_bytes_compiled_and_as_python(reference, items, fmt, labels, limits, cuts, exit_code):
    case = {"items": items, "fmt": fmt, "labels": labels, "limits": limits, "cuts": cuts, "exit": exit_code}
    ours, theirs = reference("normalize", case)
    assert ours == theirs


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32), st.sampled_from(range(len(FORMAT_TRANSCRIPTS))), st.booleans(), st.booleans(),
       st.floats(0, 0.4), st.integers(0, 8))
def test_entries_through_the_sequencer_give_the_same_bytes_compiled_and_as_python(reference, seed, t, label, redact,
                                                                                  disorder, spacing):
    fmt, lines = FORMAT_TRANSCRIPTS[t]
    lines = list(lines)
    if spacing:  # a secret line every `spacing` lines
        for i in range(0, len(lines), spacing):
            lines.insert(i, SECRET_LINES[i % len(SECRET_LINES)])
    case = {"seed": seed, "lines": lines, "fmt": fmt if label else None, "redact": redact, "disorder": disorder}
    ours, theirs = reference("sequence", case)
    assert ours == theirs


@pytest.mark.parametrize("t", range(len(FORMAT_TRANSCRIPTS)), ids=[f"{f}-{i}" for i, (f, _) in enumerate(FORMAT_TRANSCRIPTS)])
def test_every_fixture_transcript_gives_the_same_bytes_compiled_and_as_python(reference, t):
    fmt, lines = FORMAT_TRANSCRIPTS[t]
    ours, theirs = reference("sequence", {"seed": t, "lines": lines, "fmt": None, "redact": True, "disorder": 0.0})
    assert ours == theirs and b'"events":[{' in ours  # the run produced events, and both alike


@st.composite
def events_with_secrets(draw: st.DrawFn) -> dict:
    tree = draw(redaction_props._tree)
    for _ in range(draw(st.integers(0, 3))):
        family = draw(st.sampled_from(redaction_props.TEXT_FAMILIES))
        secret = family.format(v=draw(redaction_props._value))
        as_key = draw(st.sampled_from([None, None, "x"]))
        tree = _place(draw, tree, secret, as_key)
    key = draw(st.sampled_from(redaction_props.SECRET_KEYS + ["note"]))
    field = draw(st.sampled_from(redaction_props.CONTENT_FIELDS))
    event = {"eventId": "r:0", "runId": "r", "seq": 0, "type": draw(st.sampled_from(["command", "unknown", "warning"])),
             "timestamp": "2026-01-01T00:00:00.000Z", "lines": [0, 0], field: tree, "extra": {key: draw(redaction_props._value)}}
    if draw(st.booleans()):
        event["truncated"] = True
    return event


def _place(draw: st.DrawFn, tree: object, item: str, as_key: str | None) -> object:
    if isinstance(tree, dict):
        tree[draw(st.text(alphabet="abcdef", min_size=1, max_size=4)) + "_x"] = {item: as_key} if as_key else item
        return tree
    if isinstance(tree, list):
        tree.insert(draw(st.integers(0, len(tree))), item)
        return tree
    return [tree, item]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(events_with_secrets(), min_size=1, max_size=4), st.lists(st.text(min_size=1, max_size=8), max_size=2),
       st.lists(st.sampled_from(redaction_props.TEXT_FAMILIES).map(lambda f: f.format(v="Q9x7Lk2mN4bV8cZ1")) | st.text(max_size=60),
                max_size=4))
def test_redaction_gives_the_same_bytes_compiled_and_as_python(reference, events, secret_values, texts):
    case = {"events": events, "secret_values": secret_values, "texts": texts}
    ours, theirs = reference("redact", case)
    assert ours == theirs


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(["error", "warning", "agent"]),
                          st.one_of(st.none(), st.sampled_from(["api_retry", "retry", "rate_limit", "error_max_turns",
                                                                "server_error", "turn_failed", "unknown", "overloaded",
                                                                "authentication_failed"]), st.text(max_size=12)),
                          st.one_of(st.text(max_size=300), st.sampled_from([c[1] for c in error_class_cases.CASES]),
                                    st.sampled_from([e["text"] for e in provider_texts.CORPUS]))),
                min_size=1, max_size=20))
def test_error_classes_are_the_same_compiled_and_as_python(reference, items):
    ours, theirs = reference("classify", {"items": items})
    assert ours == theirs


def test_without_a_c_compiler_the_build_keeps_the_python_core(tmp_path: Path):
    """The install must not fail where no compiler works: it keeps the Python modules (no partial
    build: every compiled module needs the group's library) and says so in one line."""
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(REPO / name, tmp_path / name)
    for package in ("services", "contracts"):
        shutil.copytree(REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    env = {k: v for k, v in os.environ.items() if k != native.PURE_ENV}
    out = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=tmp_path,
                         env={**env, "CC": "/bin/false"}, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert [ln for ln in out.stderr.splitlines() if ln.startswith("goose-ingest:")] == [
        "goose-ingest: building the pure-Python core only (CompileError: command '/bin/false' failed with exit code 1); "
        "everything works, slower"]
    assert list(tmp_path.rglob("*.so")) == []
    kind = subprocess.run([sys.executable, "-c", "from services.native import core_kind; print(core_kind())"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    assert kind.stdout.split() == ["pure"]
