"""The real agent CLIs (pinned, from npm) against the scripted model server, every scenario.

Two views of each scenario, both against the expectation written from the scenario
(tests/agents/scenarios.py):
- live: the CLI runs now (all runs of the session in parallel, once, in a session fixture) and
  what it printed goes through the normalizer;
- committed: the capture checked in under tests/agents/captures/ goes through the normalizer, so
  the contract is held to the CLIs' real output on every machine, node or not; the scenarios that
  cannot run live (Claude's stalled stream waits >= 300 s) exist only this way.
A scenario hit by a normalizer bug being fixed on another branch is `xfail(strict=True)` with the
branch in the reason: once the fix is merged the test passes, strict turns that into a failure,
and the integrator drops the marker.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from signal import SIGINT

import pytest

from tests.agents.harness import CAPTURES, capture, check, load, normalize
from tests.agents.install import CLIS, host_missing, install, npm_missing
from tests.agents.run import Capture
from tests.agents.scenarios import FORMATS_PENDING, FORMATS_PENDING_REASON, SCENARIOS, Scenario
from tests.support.needs import missing

pytestmark = pytest.mark.e2e

PARALLEL_RUNS = 6  # CLI runs at once: they mostly wait on their own retry delays, not on the CPU


def _param(sc: Scenario) -> object:
    reason = FORMATS_PENDING_REASON if sc.cli in FORMATS_PENDING else sc.known_bug
    marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
    return pytest.param(sc, id=f"{sc.cli}-{sc.name}", marks=marks)


LIVE = [_param(sc) for scs in SCENARIOS.values() for sc in scs if sc.live]
ALL = [_param(sc) for scs in SCENARIOS.values() for sc in scs]


@pytest.fixture(scope="session")
def live_captures(request: pytest.FixtureRequest) -> dict[tuple[str, str], Capture | str]:
    """Every live scenario selected in this session (`-k` narrows it), run once in parallel: a
    Capture, or why the CLI is missing."""
    selected = {(item.callspec.params["sc"].cli, item.callspec.params["sc"].name) for item in request.session.items
                if getattr(item, "originalname", "") == "test_live_run_meets_its_expectation"}
    out: dict[tuple[str, str], Capture | str] = {}
    why = npm_missing()
    ready: list[str] = []
    for cli in sorted({cli for cli, _ in selected}):
        if why or host_missing(cli):
            out.update({(cli, sc.name): why or host_missing(cli) or "" for sc in SCENARIOS[cli]})
            continue
        try:
            install(CLIS[cli])
            ready.append(cli)
        except (RuntimeError, OSError) as exc:
            out.update({(cli, sc.name): f"npm install failed: {exc}" for sc in SCENARIOS[cli]})
    with ThreadPoolExecutor(max_workers=PARALLEL_RUNS) as pool:
        futures = {(sc.cli, sc.name): pool.submit(capture, sc, CLIS[sc.cli].pinned)
                   for cli in ready for sc in SCENARIOS[cli] if sc.live and (sc.cli, sc.name) in selected}
        out.update({key: f.result() for key, f in futures.items()})
    return out


@pytest.mark.parametrize("sc", LIVE)
def test_live_run_meets_its_expectation(sc: Scenario, live_captures) -> None:
    cap = live_captures[(sc.cli, sc.name)]
    if isinstance(cap, str):
        missing(f"the {sc.cli} CLI", f"python3 -m tests.agents.install (.ci/run does it): {cap}")
    assert cap.exit_code not in (124, 137), f"{sc.cli} {sc.name} hit the outer timeout: {cap.stdout[-3:]} {cap.stderr[-3:]}"
    events = normalize(cap.stdout, cap.stderr, cap.exit_code, sc.cli, signal=SIGINT if sc.sigint_when else None)
    assert check(sc.expect, events, sc.final_text) == []


@pytest.mark.parametrize("sc", ALL)
def test_committed_capture_meets_its_expectation(sc: Scenario) -> None:
    cap = load(sc.cli, sc.name)
    assert cap.version == CLIS[sc.cli].pinned, "captures are re-taken when a pin moves (python -m tests.agents.recapture)"
    events = normalize(cap.stdout, cap.stderr, cap.exit_code, sc.cli, signal=SIGINT if sc.sigint_when else None)
    assert check(sc.expect, events, sc.final_text) == []


def test_every_scenario_has_a_committed_capture() -> None:
    want = {(cli, sc.name) for cli, scs in SCENARIOS.items() for sc in scs}
    have = {(p.parent.name, p.stem) for p in CAPTURES.glob("*/*.json")}
    assert want <= have, f"missing captures: {sorted(want - have)}"


def test_the_check_catches_each_kind_of_difference() -> None:
    """The expectation check is the whole of these tests: it must fail on each kind of mismatch."""
    from tests.agents.scenarios import Expect

    ok = [{"type": "read", "isSuccess": True}, {"type": "agent", "message": "fin"},
          {"type": "error", "errorClass": "auth", "message": "401"},
          {"type": "warning", "code": "retry", "errorClass": "auth", "message": "r"},
          {"type": "error", "errorClass": "agent_exit", "message": "claude exited with code 1"}]
    expect = Expect(tools=(("read", True),), error_class="auth", agent_text=True)
    assert check(expect, ok, "fin") == []
    assert check(expect, [{**ok[0], "isSuccess": False}, *ok[1:]], "fin")
    assert check(expect, ok[1:], "fin")
    assert check(expect, [*ok[:3], {**ok[3], "errorClass": "other"}, ok[4]], "fin")
    assert check(expect, [ok[0], ok[1], ok[4]], "fin")
    assert check(expect, [*ok, {"type": "unknown", "raw": {}}], "fin")
    assert check(expect, ok, "other text")
    assert check(Expect(), [ok[4]], "") == []
    assert check(Expect(exit_nonzero_ok=False), [ok[4]], "")
    assert check(Expect(warning_class="timeout"), [], "")
