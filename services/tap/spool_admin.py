"""`goose-ingest spool`: the runs waiting in this host's spool -- listed, delivered (--drain), discarded.

Read without taking a run's lock (a live tap holds it): a run in use is shown as such and left to
the tap that publishes it.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import threading

from services.settings import Settings
from services.tap.console import PROG, err
from services.tap.credentials import NO_BROKER, broker_configured
from services.tap.delivery import drain, run_labels
from services.tap.outcome import UNDELIVERED_EXIT
from services.tap.publisher import Publisher
from services.tap.spool import SpoolCorrupt, SpoolLocked


def list_drain_or_discard(args: argparse.Namespace, settings: Settings) -> int:
    runs = spooled_runs(settings)
    if args.discard:
        return _discard(settings, runs, args.discard)
    for r in runs:
        state = "ended" if r["ended"] else "open"
        use = "  (a tap is publishing it)" if r["in_use"] else ""
        print(f"{r['run']}  {r['entries']} entries, {r['pending']} not confirmed, {state}{use}")
    from services.tap.spool import refused_runs

    for run, n, path in refused_runs(settings):
        print(f"{run}  {n} entries refused by the gateway for good, kept in {path}")
    if not args.drain:
        err(f"{len(runs)} spooled run{'s' if len(runs) != 1 else ''} in {settings.spool_dir}"
            + (f": deliver them with `{PROG} spool --drain`" if any(r["pending"] for r in runs) else ""))
        return 0
    if runs and not broker_configured(settings):  # a gateway's taps drain through it
        err(NO_BROKER)
        return 2
    try:
        return _drain_spooled(settings, runs, args.drain_timeout)
    except KeyboardInterrupt:
        err(f"interrupted: what is not delivered stays in the spool; `{PROG} spool` lists it")
        return 130


def spooled_runs(settings: Settings) -> list[dict[str, object]]:
    """Every run of the configured namespace with a spool: run, entries, pending, ended, in_use, path.

    Read without taking the lock (a live tap holds it); `in_use` says whether one does."""
    from services.tap.spool import LOCK, LOG, SENT, spool_path

    root = spool_path(settings, "x").parent
    found: list[dict[str, object]] = []
    if not root.is_dir():
        return found
    for path in sorted(root.iterdir()):
        log_file = path / LOG
        if not log_file.is_file():
            continue
        lines = [line for line in log_file.read_bytes().split(b"\n") if line.strip()]
        if not lines:
            continue
        try:
            import orjson

            first, last = orjson.loads(lines[0]), orjson.loads(lines[-1])
        except ValueError:
            first, last = {}, {}
        try:
            sent = int((path / SENT).read_text().strip() or 0)
        except (OSError, ValueError):
            sent = 0
        found.append({"run": str(first.get("run") or path.name), "entries": len(lines),
                      "pending": max(0, len(lines) - sent), "ended": last.get("kind") == "eof",
                      "in_use": _locked(path / LOCK), "path": str(path)})
    return found


def _locked(lock: os.PathLike[str] | str) -> bool:
    try:
        fd = os.open(lock, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _discard(settings: Settings, runs: list[dict[str, object]], wanted: list[str]) -> int:
    from services.tap.spool import discard, refused_path

    by_run = {str(r["run"]): r for r in runs}
    failed = 0
    for run in wanted:
        r = by_run.get(run)
        refused = refused_path(settings, run)
        if refused.is_file():  # the entries the gateway refused for good go with it
            refused.unlink()
            if r is None:
                err(f"run {run}: discarded its entries refused by the gateway")
                continue
        if r is None:
            err(f"run {run}: not in the spool (`{PROG} spool` lists it)")
            failed += 1
            continue
        try:
            discard(str(r["path"]))
        except (SpoolLocked, OSError) as exc:
            err(f"run {run}: {exc}")
            failed += 1
            continue
        err(f"run {run}: discarded ({r['pending']} entries were not delivered)")
    return 1 if failed else 0


def _drain_spooled(settings: Settings, runs: list[dict[str, object]], timeout: float | None) -> int:
    left = 0
    abort = threading.Event()
    for r in runs:
        if r["in_use"] or not (r["pending"] or r["ended"]):
            continue  # a live tap delivers its own; an open run with nothing pending is only its seq counter
        run = str(r["run"])
        try:
            pub = Publisher(settings, run, run_labels(settings, None))
        except (SpoolLocked, SpoolCorrupt, OSError, ValueError) as exc:
            err(f"run {run}: {exc}")
            left += 1
            continue
        if not drain(pub, timeout, abort):
            left += 1
        else:
            err(f"run {run}: delivered")
        if abort.is_set():
            break
    return UNDELIVERED_EXIT if left else 0
