"""goose's real error texts per fault, from goose's own provider layer (`goose-sdk`), classified.

goose's CLI ships no package, so its stream fixtures stay hand-made; its provider layer does ship
(tests/agents/goose_sdk.py). Each fault of the model server is met by goose's Anthropic and OpenAI
providers (18 probes, in parallel, each in a child process of goose's venv); goose's error, worded
as its CLI writes it in `--output-format stream-json`, goes through the normalizer. The class must
be the contract's for that fault. goose's own opinion (its error variant) is compared too: where it
disagrees with the contract the contract decides (docs/contract.md, "When an agent CLI releases"),
and the disagreements are listed here so a goose-sdk release that changes one is seen.
"""

from __future__ import annotations

import json
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.agents.goose_sdk import GOOSE_CLASS, VERSION, cli_text
from tests.agents.harness import normalize
from tests.agents.install import install_goose_sdk
from tests.agents.model_server import ALWAYS, Cut, ModelServer, Scripted, Status, refused_url
from tests.support.fixtures import REPO
from tests.support.needs import missing

pytestmark = pytest.mark.e2e

CONTRACT = {"auth": "auth", "forbidden": "auth", "rate_limit": "rate_limit", "quota": "quota",
            "server_error": "provider_unavailable", "overloaded": "provider_unavailable",
            "context_length": "context_length", "cut": "timeout", "refused": "timeout"}
PROVIDERS = ("anthropic", "openai")
# goose's variant where it is not the contract's class (the contract decides)
GOOSE_DISAGREES = {("anthropic", "quota"): "Generic", ("openai", "quota"): "RateLimited",
                   ("anthropic", "cut"): "Generic", ("openai", "cut"): "Generic"}
OPENAI_QUOTA_LOST = (f"open (issue 36): goose-sdk {VERSION} turns OpenAI's insufficient_quota 429 into RateLimited "
                     "and keeps none of its text, so nothing left in goose's message says quota")


@pytest.fixture(scope="module")
def probes() -> dict[tuple[str, str], dict[str, str]]:
    try:
        python = install_goose_sdk()
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        missing(f"goose-sdk {VERSION}", f"python3 -m tests.agents.install (.ci/run does it): {exc}")

    def one(job: tuple[str, str]) -> dict[str, str]:
        provider, fault = job
        step = None if fault == "refused" else Cut() if fault == "cut" else Status(fault, retry_after_s=0.1)
        with ModelServer([Scripted(step, ALWAYS)] if step else [], every_request_a_turn=True) as server:
            url = refused_url() if step is None else server.url
            # a refused connection is retried until goose's own timeout: a short one; the others
            # need a long one, so that goose's retries end in its final verdict, not a timeout
            timeout_ms = "3000" if fault == "refused" else "30000"
            out = subprocess.run([str(python), str(REPO / "tests/agents/goose_sdk.py"), "--probe", provider, url, timeout_ms],
                                 capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout)

    jobs = [(p, f) for p in PROVIDERS for f in CONTRACT]
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        return dict(zip(jobs, pool.map(one, jobs), strict=True))


def _param(provider: str, fault: str) -> object:
    marks = [pytest.mark.xfail(strict=True, reason=OPENAI_QUOTA_LOST)] if (provider, fault) == ("openai", "quota") else []
    return pytest.param(provider, fault, id=f"{provider}-{fault}", marks=marks)


@pytest.mark.parametrize(("provider", "fault"), [_param(p, f) for p in PROVIDERS for f in CONTRACT])
def test_goose_s_error_text_gets_the_contract_s_class(probes, provider: str, fault: str) -> None:
    got = probes[(provider, fault)]
    assert got["variant"] != "ok", f"goose did not fail on {fault}"
    line = json.dumps({"type": "error", "error": cli_text(got["variant"], got["details"])})
    errors = [e for e in normalize([line], [], 0, "goose") if e["type"] == "error"]
    assert [e["errorClass"] for e in errors] == [CONTRACT[fault]], (got, errors)


def test_goose_s_own_opinion_agrees_with_the_contract_but_where_listed(probes) -> None:
    disagree = {job: r["variant"] for job, r in probes.items() if GOOSE_CLASS.get(r["variant"]) != CONTRACT[job[1]]}
    assert disagree == GOOSE_DISAGREES
