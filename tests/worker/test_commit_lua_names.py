"""The Lua boundary named on both sides: commit.lua's reply codes and run fields against commit.py's,
and the OTLP exporter's scripts in .lua files beside its Python (issue 25 item 6).

Text checks (the scripts themselves run against real Redis in tests/e2e/test_worker_e2e.py,
tests/worker/test_shard_leases.py and the OTLP exporter's tests); the last test runs commit.lua once on a
real redis-server to see the named codes come back.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from uuid import uuid4

import pytest

from services.export.otlp import run_state as otlp_run_state
from services.worker.commit import (
    COMMIT_LUA,
    STATE_FIELD,
    VERSION_FIELD,
    Commit,
    Committer,
    LeaseLost,
    ReplyCode,
    RunArgs,
)

ROOT = Path(__file__).resolve().parents[2]
OTLP = ROOT / "services" / "export" / "otlp"


def _lua_constants(text: str) -> dict[str, int]:
    match = re.search(r"^local ((?:[A-Z_]+, )*[A-Z_]+) = ((?:\d+, )*\d+)$", text, re.M)
    assert match, "commit.lua names its reply codes in one `local A, B = 1, 2` line"
    names = match.group(1).split(", ")
    values = [int(v) for v in match.group(2).split(", ")]
    return dict(zip(names, values, strict=True))


def test_reply_codes_are_the_same_names_and_values_in_python_and_lua():
    assert _lua_constants(COMMIT_LUA) == {code.name: code.value for code in ReplyCode}


def test_commit_lua_returns_only_named_codes():
    returns = re.findall(r"return \{([^}]*)\}", COMMIT_LUA)
    assert returns, "commit.lua returns tables"
    for value in returns:
        assert not re.match(r"\s*\d", value), f"a bare reply code in commit.lua: return {{{value}}}"
    assert re.search(r"\{CONFLICT\}", COMMIT_LUA) and re.search(r"\{COMMITTED\}", COMMIT_LUA)


def test_run_fields_are_unpacked_once_under_the_names_python_sends_them_by():
    unpacks = re.findall(r"local ([\w, ]+) = unpack\(runs\[r\](?:, 1, (\d+))?\)", COMMIT_LUA)
    assert unpacks, "commit.lua unpacks a run into named locals"
    full = [names for names, count in unpacks if not count]
    assert [n.strip() for n in full[0].split(",")] == list(RunArgs._fields)
    for names, count in unpacks:
        if count:
            assert [n.strip() for n in names.split(",")] == list(RunArgs._fields[: int(count)])
    assert not re.search(r"runs?\[r?\]?\[\d\]", COMMIT_LUA), "a run field read by its number"


def test_the_state_hash_fields_are_commit_pys():
    assert f"'{VERSION_FIELD.decode()}', tostring(tonumber(version) + 1), '{STATE_FIELD.decode()}', state" in COMMIT_LUA


@pytest.mark.parametrize("name", ["note", "adopt", "close"])
def test_the_otlp_scripts_live_in_lua_files_beside_their_python(name):
    path = OTLP / f"{name}.lua"
    assert path.is_file()
    assert getattr(otlp_run_state, f"_{name.upper()}_LUA") == path.read_text()
    assert path.read_text().startswith("--"), "each script says its KEYS, ARGV and reply first"
    assert all('"""\nlocal' not in p.read_text() for p in OTLP.glob("*.py")), "inline Lua left in a module"


def test_commit_lua_replies_with_the_named_codes_on_a_real_redis(redis_url):
    import redis.asyncio as aioredis

    async def go() -> None:
        client = aioredis.Redis.from_url(redis_url)
        try:
            committer = Committer(client)
            stream, active, lease = (f"t{uuid4().hex[:10]}:{name}" for name in ("raw", "active", "lease"))
            await client.delete(stream, active, lease)
            assert await committer.commit(Commit(stream, "g", active, 1000)) == []  # COMMITTED
            await client.set(lease, "someone-else")
            with pytest.raises(LeaseLost):
                await committer.commit(Commit(stream, "g", active, 1000, lease=lease, owner="me"))
        finally:
            await client.delete(stream, active, lease)
            await client.aclose()

    asyncio.run(go())
