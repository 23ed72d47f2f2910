"""Build ``goose-ingest-tap``: the tap-only distribution of this repository (issue 34, item 6).

A pure-Python wheel of the same packages (``contracts``, ``services``) that depends only on what the
tap, ``publish``, ``spool`` and ``import-sessions`` through a gateway import: pydantic,
pydantic-settings, orjson and hiredis (the RESP reader of the direct mode, imported by the
publisher). Every other command is in it too and says in one line that it needs the full install
(``services/cli.py``). Install one of the two distributions, not both: they hold the same packages.

    python packaging/tap/build.py [--out DIR]      # prints the wheel's path

The wheel is written directly (a zip with its ``.dist-info``: PEP 427), so building needs no
network, no build backend and no compiler; the version is the main ``pyproject.toml``'s.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import re
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NAME = "goose-ingest-tap"
DIST = NAME.replace("-", "_")
# What the tap imports, beyond the standard library (tests/gateway/test_gateway.py::
# test_the_tap_only_distribution_installs_alone_and_delivers_through_a_gateway holds a tap installed with
# only these to deliver through a gateway).
REQUIRES = ("pydantic>=2.7", "pydantic-settings>=2.3", "orjson>=3.9", "hiredis>=2")
PACKAGES = ("contracts", "services")
DATA_SUFFIXES = (".py", ".json", ".lua", ".sql")


def version() -> str:
    m = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    if m is None:
        raise SystemExit("no version in pyproject.toml")
    return m.group(1)


def files() -> list[Path]:
    out: list[Path] = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*")):
            if path.is_file() and path.suffix in DATA_SUFFIXES and "__pycache__" not in path.parts:
                out.append(path)
    return out


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build(out_dir: Path) -> Path:
    v = version()
    info = f"{DIST}-{v}.dist-info"
    wheel = out_dir / f"{DIST}-{v}-py3-none-any.whl"
    out_dir.mkdir(parents=True, exist_ok=True)
    metadata = "\n".join([
        "Metadata-Version: 2.1", f"Name: {NAME}", f"Version: {v}",
        "Summary: goose-ingest's tap only: spool and publish agent output through an ingest gateway or to Redis",
        "Requires-Python: >=3.11", *(f"Requires-Dist: {r}" for r in REQUIRES), "",
        "The tap of goose-ingest (docs/gateway.md, 'A tap-only install on an agent host').", ""])
    meta_files = {
        f"{info}/METADATA": metadata,
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: goose-ingest packaging/tap/build.py\nRoot-Is-Purelib: true\n"
                         "Tag: py3-none-any\n",
        f"{info}/entry_points.txt": "[console_scripts]\ngoose-ingest = services.cli:main\n",
        f"{info}/top_level.txt": "".join(f"{p}\n" for p in PACKAGES),
    }
    records: list[str] = []
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        for path in files():
            name = path.relative_to(ROOT).as_posix()
            data = path.read_bytes()
            z.writestr(name, data)
            records.append(_record_line(name, data))
        for name, text in meta_files.items():
            z.writestr(name, text)
            records.append(_record_line(name, text.encode()))
        records.append(f"{info}/RECORD,,")
        z.writestr(f"{info}/RECORD", "\n".join(records) + "\n")
    return wheel


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "dist"), help="directory of the wheel (default dist/)")
    print(build(Path(ap.parse_args().out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
