"""Re-capture every scenario with another version of an agent CLI and report what changed.

    python -m tests.agents.recapture --cli claude-code --version latest [--report FILE] [--update] [--slow]

Installs `<cli>@<version>` into the cache (tests/agents/install.py), runs each scenario of
tests/agents/scenarios.py against the scripted model server (in parallel), and compares with the
captures committed under tests/agents/captures/<cli>/ (taken with the pinned version):
- record types (`type`, or `type/subtype`) that are new or gone, per scenario and over all of them,
- fields (dotted paths per record type, over all scenarios) that are new or gone,
- the events the normalizer makes of each capture, where they differ (envelope fields aside),
- `unknown` and `warning` counts per scenario, and whether the scenario's expectation still holds.
The report is Markdown (stdout, or `--report FILE`). `--update` writes the new captures over the
committed ones (what moving a pin does: docs/contract.md, "When an agent CLI releases");
`--slow` includes the scenarios that only exist as captures (Claude's stalled stream: >= 5 min).
Exit 0 when every expectation holds, 1 otherwise, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from signal import SIGINT
from typing import Any

from tests.agents.harness import CAPTURES, capture, check, load, normalize, save
from tests.agents.install import CLIS, install, npm_missing, resolve
from tests.agents.run import Capture
from tests.agents.scenarios import FORMATS_PENDING, SCENARIOS, Scenario

SLOW_TIMEOUT_S = 1500  # Claude's stalled stream: its idle floor (>= 300 s) times its retries
ENVELOPE = ("eventId", "runId", "seq", "timestamp", "lines", "durationMs", "sessionId", "toolCallId")


def records(lines: list[str]) -> list[dict[str, Any]]:
    out = []
    for line in lines:
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out


def record_type(rec: dict[str, Any]) -> str:
    t = str(rec.get("type"))
    sub = rec.get("subtype")
    if isinstance(sub, str):
        return f"{t}/{sub}"
    item = rec.get("item")
    if isinstance(item, dict) and isinstance(item.get("type"), str):  # Codex items
        return f"{t}/{item['type']}"
    return t


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def field_paths(value: Any, prefix: str = "", depth: int = 0) -> set[str]:
    """Dotted key paths of a record (lists looked into as `[]`), 4 levels deep at most."""
    out: set[str] = set()
    if depth >= 4:
        return out
    if isinstance(value, dict):
        for k, v in value.items():
            # a key that is data, not a name (a model id in `modelUsage`): one `*` for all of them
            key = str(k) if _NAME.fullmatch(str(k)) else "*"
            path = f"{prefix}.{key}" if prefix else key
            out.add(path)
            out |= field_paths(v, path, depth + 1)
    elif isinstance(value, list):
        for v in value:
            out |= field_paths(v, f"{prefix}[]", depth + 1)
    return out


def shape(lines: list[str]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for rec in records(lines):
        out.setdefault(record_type(rec), set()).update(field_paths(rec))
    return out


def projected(events: list[dict[str, Any]]) -> list[str]:
    """Events without what changes from run to run (ids, times, paths of scratch folders)."""
    out = []
    for e in events:
        body = {k: v for k, v in e.items() if k not in ENVELOPE and k not in ("raw",)}
        if "path" in body and isinstance(body["path"], str) and "/" in body["path"]:
            body["path"] = body["path"].rsplit("/", 1)[-1]
        if "message" in body and isinstance(body["message"], str):
            body["message"] = body["message"][:100]
        out.append(json.dumps(body, sort_keys=True))
    return out


def merged(shapes: list[dict[str, set[str]]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for sh in shapes:
        for rtype, fields in sh.items():
            out.setdefault(rtype, set()).update(fields)
    return out


def fields_report(old: list[Capture], new: list[Capture]) -> list[str]:
    """New and gone fields per record type, over every scenario at once (a field one scenario's
    records happen not to carry is not reported gone)."""
    before, after = merged([shape(c.stdout) for c in old]), merged([shape(c.stdout) for c in new])
    lines = ["## Record types and fields, all scenarios", ""]
    if added := sorted(set(after) - set(before)):
        lines.append(f"- new record types: {', '.join(added)}")
    if gone := sorted(set(before) - set(after)):
        lines.append(f"- record types gone: {', '.join(gone)}")
    for rtype in sorted(set(before) & set(after)):
        if new_fields := sorted(after[rtype] - before[rtype]):
            lines.append(f"- `{rtype}` new fields: {', '.join(new_fields)}")
        if gone_fields := sorted(before[rtype] - after[rtype]):
            lines.append(f"- `{rtype}` fields gone: {', '.join(gone_fields)}")
    if len(lines) == 2:
        lines.append("- none")
    return lines + ["", "## Scenarios", ""]


def compare(sc: Scenario, old: Capture | None, new: Capture) -> tuple[list[str], bool]:
    """Report lines for one scenario and whether its expectation holds with the new capture."""
    events = normalize(new.stdout, new.stderr, new.exit_code, sc.cli, signal=SIGINT if sc.sigint_when else None)
    problems = check(sc.expect, events, sc.final_text)
    counts = Counter(e["type"] for e in events)
    lines = [f"### {sc.name}", "",
             f"- exit {new.exit_code}, {new.seconds:.1f} s; events: {len(events)}, unknown: {counts['unknown']}, "
             f"warning: {counts['warning']}, error: {counts['error']}",
             f"- expectation: {'holds' if not problems else 'FAILS: ' + '; '.join(problems)}"
             + (f" (known: {sc.known_bug})" if sc.known_bug else "")
             + (" (format not merged yet: scenarios.FORMATS_PENDING)" if sc.cli in FORMATS_PENDING else "")]
    if old is None:
        lines += ["- no committed capture to compare with", ""]
        return lines, not problems
    before, after = shape(old.stdout), shape(new.stdout)
    if added := sorted(set(after) - set(before)):
        lines.append(f"- new record types: {', '.join(added)}")
    if gone := sorted(set(before) - set(after)):
        lines.append(f"- record types gone: {', '.join(gone)}")
    old_events = normalize(old.stdout, old.stderr, old.exit_code, sc.cli, signal=SIGINT if sc.sigint_when else None)
    old_counts = Counter(e["type"] for e in old_events)
    if (old_counts["unknown"], old_counts["warning"]) != (counts["unknown"], counts["warning"]):
        lines.append(f"- unknown {old_counts['unknown']} -> {counts['unknown']}, "
                     f"warning {old_counts['warning']} -> {counts['warning']}")
    a, b = projected(old_events), projected(events)
    if a != b:
        lines.append("- events changed:")
        lines += [f"  - was: `{x}`" for x in a if x not in b][:10]
        lines += [f"  - now: `{x}`" for x in b if x not in a][:10]
    lines.append("")
    return lines, not problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.agents.recapture", description=__doc__.splitlines()[0])
    parser.add_argument("--cli", required=True, choices=sorted(SCENARIOS))
    parser.add_argument("--version", default=None, help="an npm version or dist-tag (default: the pinned one)")
    parser.add_argument("--report", type=Path, default=None, help="write the Markdown report here (default: stdout)")
    parser.add_argument("--update", action="store_true", help="write the new captures over the committed ones")
    parser.add_argument("--slow", action="store_true", help="also the capture-only scenarios (minutes)")
    parser.add_argument("--scenario", action="append", default=[], help="only these scenarios")
    parser.add_argument("--parallel", type=int, default=6)
    args = parser.parse_args(argv)
    why = npm_missing()
    if why:
        print(f"recapture needs node and npm: {why}", file=sys.stderr)
        return 2
    cli = CLIS[args.cli]
    version = resolve(cli, args.version) if args.version else cli.pinned
    install(cli, version)
    scs = [sc for sc in SCENARIOS[args.cli] if (sc.live or args.slow) and (not args.scenario or sc.name in args.scenario)]
    if not scs:
        print("no scenario selected", file=sys.stderr)
        return 2
    if args.slow:
        import tests.agents.run as run_mod

        run_mod.RUN_TIMEOUT_S = SLOW_TIMEOUT_S
    with ThreadPoolExecutor(max_workers=args.parallel) as pool:
        caps = dict(zip([sc.name for sc in scs], pool.map(lambda sc: capture(sc, version), scs), strict=True))
    report = [f"# {cli.package}@{version} against the captures of {cli.pinned}", ""]
    olds: dict[str, Capture | None] = {}
    for sc in scs:
        try:
            olds[sc.name] = load(args.cli, sc.name)
        except FileNotFoundError:
            olds[sc.name] = None
    report += fields_report([c for c in olds.values() if c is not None],
                            [caps[name] for name, c in olds.items() if c is not None])
    ok = True
    for sc in scs:
        lines, held = compare(sc, olds[sc.name], caps[sc.name])
        report += lines
        ok = ok and (held or sc.known_bug is not None or sc.cli in FORMATS_PENDING)
    text = "\n".join(report) + "\n"
    if args.report:
        args.report.write_text(text)
        print(f"report: {args.report}")
    else:
        sys.stdout.write(text)
    if args.update:
        for cap in caps.values():
            save(cap, CAPTURES)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
