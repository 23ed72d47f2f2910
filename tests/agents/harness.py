"""Capture a scenario with a real CLI, normalize a capture, check events against an expectation."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tests.agents.model_server import ModelServer, refused_url
from tests.agents.run import Capture, Invocation, invocation, run
from tests.agents.scenarios import NOTES, Expect, Scenario

CAPTURES = Path(__file__).parent / "captures"
RUN_ATTEMPTS = 2  # a run that hits the outer `timeout` (exit 124/137) is tried once more, then reported
T0_MS = 1_790_000_000_000  # timestamps of a normalized capture: one per line, 1 ms apart


def scratch_root() -> Path:
    """Where runs get their HOME and working directory: not under /tmp, where Codex refuses to
    create its helper binaries (a warning on every run that is no part of any scenario)."""
    path = Path("/var/tmp/goose-ingest-agents")
    path.mkdir(parents=True, exist_ok=True)
    return path


def prepare(root: Path) -> Path:
    work = root / "work"
    work.mkdir(parents=True, exist_ok=True)
    (work / "notes.txt").write_text(NOTES)
    return work


@dataclass
class Live:
    """A scenario being run: its model server and invocation (the caller may wrap the command)."""

    scenario: Scenario
    server: ModelServer
    inv: Invocation


def capture(sc: Scenario, version: str, root: Path | None = None, outer: list[str] | None = None,
            outer_env: dict[str, str] | None = None) -> Capture:
    """Run one scenario with the real CLI (bounded retries on the outer timeout only).

    `outer`: a command the CLI runs under (`goose-ingest tap --run R --`), inside the `timeout`;
    `outer_env`: what it needs in the environment beside the CLI's own."""
    last: Capture | None = None
    for _attempt in range(RUN_ATTEMPTS):
        base = Path(tempfile.mkdtemp(prefix=f"agents-{sc.cli}-{sc.name}-", dir=str(root or scratch_root())))
        work = prepare(base)
        with ModelServer(sc.script(work)) as server:
            url = refused_url() if sc.refused else server.url
            inv = invocation(sc.cli, version, url, sc.prompt, base, max_turns=sc.max_turns,
                             unbounded_retries=sc.unbounded_retries, variant=sc.variant)
            if outer_env:
                inv.env.update(outer_env)
            if sc.stdin_words:
                inv.stdin = b"word " * sc.stdin_words
            out, err, code, secs = run(inv, sigint_when=sc.sigint_when, sigint_after_s=sc.sigint_after_s, outer=outer)
            last = Capture(sc.cli, version, sc.name, out, err, code, secs, requests=len(server.seen),
                           extra={"paths": sorted({s.path for s in server.seen})})
        if not os.environ.get("GOOSE_INGEST_AGENTS_KEEP"):
            # ~4 MB a run (the CLIs' HOME caches): gone unless asked to keep them for a look
            shutil.rmtree(base, ignore_errors=True)
        if code not in (124, 137):
            return last
    assert last is not None
    return last


def capture_all(scenarios: list[Scenario], version: str, workers: int = 4) -> dict[str, Capture]:
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {sc.name: pool.submit(capture, sc, version) for sc in scenarios}
        return {name: f.result() for name, f in futures.items()}


def normalize(cap_stdout: list[str], cap_stderr: list[str], exit_code: int | None, fmt: str | None,
              run_id: str = "capture", signal: int | None = None) -> list[dict]:
    """What the pipeline makes of a capture: the pure normalizer over stderr then stdout (as
    `goose-ingest normalize --stderr` orders them), the format fixed as the tap's label fixes it.
    `signal`: the signal the harness sent the CLI, as the tap reports one it forwarded (eof `signal`)."""
    from services.normalizer import RunNormalizer

    norm = RunNormalizer(run_id)
    out: list[dict] = list(norm.apply_labels(fmt, None, 0, T0_MS))
    seq = 0
    for stream, lines in (("stderr", cap_stderr), ("stdout", cap_stdout)):
        for line in lines:
            out += norm.line(seq, T0_MS + seq, line, stream)
            seq += 1
    out += norm.end(seq, T0_MS + seq, exit_code, signal=signal)
    return [dict(e) for e in out]


TOOL_TYPES = {"read", "write", "search", "list", "command", "skill"}
MAX_SHOWN = 12  # tool events quoted in a problem


def exit_error(event: dict) -> bool:
    return event.get("type") == "error" and event.get("errorClass") == "agent_exit"


def check(expect: Expect, events: list[dict], final_text: str) -> list[str]:
    """Every way `events` differ from the expectation (empty: they meet it). A run the harness
    interrupted ends with the `signalled` error: the expectation's own when it expects `cancelled`,
    otherwise the end of a run stopped on purpose (opencode's compaction loop), like an exit error."""
    problems: list[str] = []
    if expect.error_class != "cancelled":
        events = [e for e in events if not (e["type"] == "error" and e.get("code") == "signalled")]
    tools = [(e["type"], e.get("isSuccess")) for e in events if e["type"] in TOOL_TYPES]
    if tools != list(expect.tools):
        # a looping run has thousands: the first ones and the count say enough
        shown = f"{tools[:MAX_SHOWN]} (+{len(tools) - MAX_SHOWN} more)" if len(tools) > MAX_SHOWN else str(tools)
        problems.append(f"tool events {shown} != expected {list(expect.tools)}")
    errors = [e for e in events if e["type"] == "error" and not exit_error(e)]
    classed_warnings = [e for e in events if e["type"] == "warning" and "errorClass" in e]
    if expect.error_class is None:
        if errors:
            problems.append(f"errors where none were expected: {[e.get('message') for e in errors]}")
        if expect.warning_class is not None:
            if not classed_warnings:
                problems.append(f"no retry warning (expected class {expect.warning_class})")
            wrong = [(e.get("errorClass"), str(e.get("message"))[:120]) for e in classed_warnings
                     if e.get("errorClass") != expect.warning_class]
            if wrong:
                problems.append(f"retry warnings with another class than {expect.warning_class}: {wrong}")
    else:
        if not errors:
            problems.append(f"no error event (expected class {expect.error_class})")
        wrong = [(e["type"], e.get("errorClass"), str(e.get("message"))[:120]) for e in errors + classed_warnings
                 if e.get("errorClass") != expect.error_class]
        if wrong:
            problems.append(f"events with another class than {expect.error_class}: {wrong}")
    if not expect.exit_nonzero_ok and [e for e in events if exit_error(e)]:
        problems.append("the CLI exited non-zero")
    unknown = [e for e in events if e["type"] == "unknown"]
    if unknown and not expect.unknown_ok:
        problems.append(f"unknown events: {[json.dumps(e.get('raw'))[:160] for e in unknown]}")
    if expect.agent_text and not any(e["type"] == "agent" and final_text in e.get("message", "") for e in events):
        problems.append(f"no agent event with the scripted final text {final_text!r}")
    return problems


def save(cap: Capture, folder: Path = CAPTURES) -> Path:
    """A committed capture: `<folder>/<cli>/<scenario>.json` (the CLI's lines, its exit code, its version).
    A line over ABRIDGE_CHARS (a prompt echoed whole) is kept as its start and a note of its length:
    the repository holds no megabyte of filler, and such a line is no record a format maps (a JSON
    line cut so is unparseable, which the committed-capture test then shows as a changed event)."""
    path = folder / cap.cli / f"{cap.scenario}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    data = cap.to_json()
    for stream in ("stdout", "stderr"):
        data[stream] = [abridged(line) for line in (cap.stdout if stream == "stdout" else cap.stderr)]
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


ABRIDGE_CHARS = 16_384


def abridged(line: str) -> str:
    if len(line) <= ABRIDGE_CHARS:
        return line
    return f"{line[:ABRIDGE_CHARS]}... [abridged: {len(line)} characters]"


def load(cli: str, name: str, folder: Path = CAPTURES) -> Capture:
    data = json.loads((folder / cli / f"{name}.json").read_text())
    return Capture(data["cli"], data["version"], data["scenario"], data["stdout"], data["stderr"], data["exit"], 0.0)
