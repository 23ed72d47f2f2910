"""The consumer contract (issue 20, Deliver 2): one abstract test case every consumer of the topics
passes, run against the worker (`python -m services.cli worker`), `export otlp` (a real OTLP/HTTP
receiver), `export postgres` (a real PostgreSQL) and `archive` (the S3 API of moto's server on
loopback; issue 23), each a real process under its own ACL user of deploy/redis/users.acl on a
private redis-server, default settings unless a case says otherwise.

Every case reads the consumer's target back and asserts 0 lost and 0 doubled: the worker's target
is its topics (compared with one normalizer pass over the raw entries as stored, as the golden test
does); an exporter's is its collector or database, compared with what the worker wrote on the
topics; the archive's is its bucket, read back with the project's reader and compared with the raw
entries published and the worker's topics. A later consumer joins by subclassing `ConsumerContract` with a `Consumer` of its own
(tests/consumers/harness.py).

Timing: the cases of the four consumers run side by side (tests/consumers/conftest.py), and the
two long outages (Redis full for the redelivery budget + a margin, the target down for 10 minutes)
share one window, with the rollback case inside it: the folder took 6-7.5 minutes with a 170 s
target outage; the 10-minute outage adds about 7 minutes. The same contract on the 3+3 Redis
Cluster (a primary SIGKILLed mid-batch) is tests/consumers/test_contract_cluster.py, a file of its
own so pytest-xdist runs it beside this one.
"""

from __future__ import annotations

import pytest

from tests.consumers.cases import WINDOW_TIMEOUT_S, Outcome
from tests.consumers.harness import (
    MAX_DELIVERIES,
    REDELIVERY_BUDGET_S,
    TARGET_OUTAGE_S,
    ArchiveConsumer,
    Consumer,
    JsonlConsumer,
    OtlpConsumer,
    PostgresConsumer,
    WorkerConsumer,
)

pytestmark = pytest.mark.e2e


def _lost_doubled(out: Outcome) -> None:
    a = out.account
    assert a.expected > 0, "the case delivered nothing to compare"
    assert a.lost == [], f"{len(a.lost)} of {a.expected} lost: {a.lost[:10]} {a.details}"
    assert a.doubled == {}, f"{len(a.doubled)} doubled: {dict(list(a.doubled.items())[:10])}"
    assert not a.details, a.details


def _ran_through(out: Outcome) -> None:
    assert out.exited == [], f"a consumer exited on its own: {out.exited}; {out.problems}"
    assert all(code == 0 for code in out.stopped), f"exit status after SIGTERM: {out.stopped}; {out.problems}"
    assert not [p for p in out.problems if "NOPERM" in p], out.problems
    assert out.facts["pending_at_end"] == 0, f"entries left pending in its group: {out.facts['pending_at_end']}"


class ConsumerContract:
    """What every consumer promises. Subclasses set `consumer`; a case that cannot apply to it is in
    its `not_applicable` with the reason (the worker's target is Redis itself: its "target down" is
    case d; nothing is poison for the archive), and its test is not collected rather than skipped."""

    consumer: Consumer

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        consumer = cls.__dict__.get("consumer")
        for case in getattr(consumer, "not_applicable", {}):
            setattr(cls, f"test_{case}", None)  # pytest collects no test of that name

    @classmethod
    def applies(cls, case: str) -> bool:
        return case not in cls.consumer.not_applicable

    @classmethod
    def why_not(cls, case: str) -> str:
        return cls.consumer.not_applicable.get(case, "")

    def outcome(self, contract_outcomes, case: str) -> Outcome:
        assert self.applies(case), f"{self.consumer.name}: {case} does not apply: {self.why_not(case)}"
        return contract_outcomes(case, self.consumer.name)

    def test_lost_group(self, contract_outcomes):
        """a) Its group destroyed (XGROUP DESTROY on every stream it reads) while running: recreated
        at 0, everything from before and after delivered, nothing twice."""
        out = self.outcome(contract_outcomes, "lost_group")
        assert out.facts["first_delivered"] and out.facts["destroyed"] > 0, out.facts
        assert out.facts["recreated"], "the group was not recreated"
        _lost_doubled(out)
        _ran_through(out)

    def test_dead_consumer(self, contract_outcomes):
        """b) A consumer SIGKILLed with entries pending; another process (the PostgreSQL sink and the
        archive: another consumer name) reclaims them after CLAIM_IDLE_MS at defaults."""
        out = self.outcome(contract_outcomes, "dead_consumer")
        assert out.facts["caught"] and out.facts["pending_at_kill"] > 0, f"no pending entry at the kill: {out.facts}"
        _lost_doubled(out)
        _ran_through(out)

    def test_poison(self, contract_outcomes):
        """c) A poison entry is dead-lettered with a reason in the consumer's own dead-letter stream
        (at once or after at most MAX_DELIVERIES attempts) and everything else delivered."""
        out = self.outcome(contract_outcomes, "poison")
        key = out.facts["poison_key"]
        mine = [d for d in out.own_deadletters if key in str(d)]
        assert out.facts["dead_lettered"] and len(mine) == 1, (out.own_deadletters, out.foreign_deadletters)
        assert mine[0].get("reason"), mine[0]
        assert not any(key in str(d) for d in out.foreign_deadletters), out.foreign_deadletters
        deliveries = mine[0].get("deliveries") or mine[0].get("delivered")
        if deliveries and deliveries.isdigit():
            assert int(deliveries) <= MAX_DELIVERIES
        _lost_doubled(out)
        _ran_through(out)

    @pytest.mark.timeout(WINDOW_TIMEOUT_S)  # it shares the window of the 10-minute target outage
    def test_redis_full(self, contract_outcomes):
        """d) Redis at maxmemory (noeviction) for REDIS_FULL_S = CLAIM_IDLE_MS x MAX_DELIVERIES + two
        sweeps + a margin at defaults (the redelivery budget: an outage counted as deliveries would
        dead-letter everything), the consumer started into it; then freed: 0 lost, 0 doubled,
        nothing dead-lettered, no exit with a traceback."""
        out = self.outcome(contract_outcomes, "redis_full")
        assert out.facts["oom_refusals"] > 0, "Redis never refused a write: the case did not bite"
        assert out.own_deadletters == [], out.own_deadletters[:5]
        _lost_doubled(out)
        _ran_through(out)
        assert not [p for p in out.problems if "Traceback" in p], out.problems
        assert out.facts["outage_s"] > REDELIVERY_BUDGET_S

    @pytest.mark.timeout(WINDOW_TIMEOUT_S)
    def test_target_down(self, contract_outcomes):
        """e) The target unreachable (PostgreSQL stopped; the collector stopped, then answering 401,
        403, 404, 429, 503; the object store hanging) for 10 minutes at defaults (TARGET_OUTAGE_S,
        4x CLAIM_IDLE_MS x MAX_DELIVERIES) while input arrives; then back: 0 lost, 0 doubled, nothing
        dead-lettered, /readyz 503 with a reason meanwhile."""
        out = self.outcome(contract_outcomes, "target_down")
        assert out.facts["first_delivered"] and out.facts["ready_before"][0] == 200, out.facts["ready_before"]
        # after a first failed attempt (the backoff, or the archive's store timeout, until it meets the outage)
        noticed = out.facts["noticed_within_s"]
        during = [(at, code, why) for at, code, why in out.facts["readyz_during"] if at >= noticed]
        assert during and all(code == 503 for _, code, _ in during), during[:10]
        assert all(why.strip() for _, _, why in during), f"not ready without a reason: {during[:5]}"
        assert out.own_deadletters == [], out.own_deadletters[:5]
        assert out.facts["ready_after"], "not ready again after the target came back"
        _lost_doubled(out)
        _ran_through(out)
        assert out.facts["outage_s"] >= TARGET_OUTAGE_S

    def test_slow_target(self, contract_outcomes):
        """f) Every request to the target takes 500 ms, and the input takes longer than CLAIM_IDLE_MS
        to export: 0 doubled (a consumer must not re-claim its own in-flight batch), 0 lost."""
        out = self.outcome(contract_outcomes, "slow_target")
        _lost_doubled(out)
        _ran_through(out)

    def test_killed_mid_batch(self, contract_outcomes):
        """g) SIGKILL once part of the input reached the target with a batch pending, then the same
        command again, default settings: 0 lost, 0 doubled."""
        out = self.outcome(contract_outcomes, "killed_mid_batch")
        assert out.facts["caught"], f"never caught mid-batch: {out.facts}"
        _lost_doubled(out)
        _ran_through(out)


    # The broker's own faults (issue 32; docs/consumers.md "The broker's own faults").
    @pytest.mark.timeout(WINDOW_TIMEOUT_S)  # it runs in the window of the 10-minute target outage (conftest)
    def test_rollback(self, contract_outcomes):
        """Redis restarted from an older snapshot mid-stream (runs A, SAVE while a batch of A is
        pending, runs B delivered, SIGKILL and restart from the snapshot, runs C): what Redis still holds after the rollback (A and C)
        is delivered exactly once; nothing is doubled in the target over every run, B included (B
        was delivered before Redis lost it; the worker's target is Redis, so B's events went with
        the snapshot). What Redis lost before a consumer read it is not promised by a consumer of
        Redis: the archive counts it (TestArchive.test_rollback, GooseIngestBrokerLostEntries)."""
        out = self.outcome(contract_outcomes, "rollback")
        assert out.facts["first_delivered"] and out.facts["second_delivered"], out.facts
        assert out.facts["lost_from_redis"] > 0, "the snapshot held everything: the case did not bite"
        if not self.consumer.brief_batches:  # why a sink may be exempt: Consumer.brief_batches
            assert out.facts["caught_at_save"] and out.facts["pending_at_save"] > 0, f"not snapshotted mid-batch: {out.facts}"
        assert out.facts["runs_owed"] < out.facts["runs_fed"] or self.consumer.name == "archive", out.facts
        _lost_doubled(out)
        assert out.facts["doubled_over_all_runs"] == {}, dict(list(out.facts["doubled_over_all_runs"].items())[:10])
        _ran_through(out)

    def test_second_instance(self, contract_outcomes):
        """A second instance of the same command beside the first, while input arrives: both run
        (the worker's shard leases, the exporters' groups share the work), 0 lost, 0 doubled."""
        out = self.outcome(contract_outcomes, "second_instance")
        assert out.facts["second_exit"] is None, f"the second instance exited: {out.facts['second_log'][-2000:]}"
        _lost_doubled(out)
        _ran_through(out)

    def test_lost_group_trimmed(self, contract_outcomes):
        """a) with the head trimmed first (the older half of every stream it reads): recreated, what
        was delivered stays delivered once, what came after is delivered, nothing twice."""
        out = self.outcome(contract_outcomes, "lost_group_trimmed")
        assert out.facts["first_delivered"] and out.facts["trimmed"] > 0 and out.facts["destroyed"] > 0, out.facts
        _lost_doubled(out)
        _ran_through(out)


class TestWorker(ConsumerContract):
    consumer = WorkerConsumer()  # target_down and slow_target are not collected: WorkerConsumer.not_applicable


def _doubled_only_in_the_window(out: Outcome) -> None:
    """OTLP after a SIGKILL: 0 lost, and sent twice (once more, no more) only what the collector
    had accepted that the exporter's state did not yet count as sent (the harness's `at_kill`)."""
    assert out.account.expected > 0, "the case delivered nothing to compare"
    assert not out.account.lost, f"lost {len(out.account.lost)}: {out.account.lost[:10]}"
    assert out.facts["receiver_quiet"], "the collector was still answering the killed exporter's requests"
    window = set(out.facts["accepted_not_noted"])
    outside = {k: n for k, n in out.account.doubled.items() if k not in window}
    assert not outside, f"sent twice outside the accept-to-note window: {dict(list(outside.items())[:10])}"
    assert all(n == 2 for n in out.account.doubled.values()), out.account.doubled


class TestExportOtlp(ConsumerContract):
    consumer = OtlpConsumer()

    def test_dead_consumer(self, contract_outcomes):
        """b) for OTLP: the kill lands anywhere a batch is pending, so also, now and then, between
        the collector's acceptance of a request and the exporter's note of it (seen once in a full
        run: 9 tool spans of one batch, each in that window). As in g): nothing lost, nothing sent
        twice outside that window; everything else as for every consumer."""
        out = self.outcome(contract_outcomes, "dead_consumer")
        assert out.facts["caught"] and out.facts["pending_at_kill"] > 0, f"no pending entry at the kill: {out.facts}"
        _doubled_only_in_the_window(out)
        assert not out.account.details, out.account.details
        _ran_through(out)

    def test_killed_mid_batch(self, contract_outcomes):
        """g) for OTLP, whose collector has no idempotent write: 0 lost, and nothing sent twice but
        what the collector accepted in the instant before the kill that the exporter had not yet
        noted (docs/otel.md "Ids": the copies carry the same trace and span ids, which Phoenix and
        Tempo keep once): tool spans whose events the run's state did not count as seen, and roots
        (with their span events) whose run the state had not closed. Nothing the state counted as
        sent at the kill is sent again."""
        out = self.outcome(contract_outcomes, "killed_mid_batch")
        assert out.facts["caught"], f"never caught mid-batch: {out.facts}"
        _doubled_only_in_the_window(out)
        _ran_through(out)


    @pytest.mark.timeout(WINDOW_TIMEOUT_S)
    def test_rollback(self, contract_outcomes):
        """rollback for OTLP, whose collector has no idempotent write: 0 lost over what Redis still
        holds. Sent again is only what the exporter had sent after the snapshot (Redis forgot it
        was sent: the acknowledgements and the run state went back with it) or what was in the
        accept-to-note window at the snapshot (as in killed_mid_batch); each at most once more,
        every copy with the trace id and span id of the first (docs/otel.md "Ids": Phoenix and
        Tempo keep one). Nothing of runs B (exported, then lost by Redis) is sent again."""
        out = self.outcome(contract_outcomes, "rollback")
        assert out.facts["first_delivered"] and out.facts["second_delivered"], out.facts
        assert out.facts["lost_from_redis"] > 0, "the snapshot held everything: the case did not bite"
        if not self.consumer.brief_batches:  # why a sink may be exempt: Consumer.brief_batches
            assert out.facts["caught_at_save"] and out.facts["pending_at_save"] > 0, f"not snapshotted mid-batch: {out.facts}"
        assert out.facts["receiver_quiet"], "the collector was still answering the frozen exporter's requests"
        assert out.account.expected > 0 and not out.account.lost, f"lost {len(out.account.lost)}: {out.account.lost[:10]}"
        doubled = out.facts["doubled_over_all_runs"]
        window = set(out.facts["accepted_not_noted"])
        noted_before = {k for k in doubled if k in set(out.facts["received_at_snapshot"]) and k not in window}
        assert not noted_before, f"sent again although noted as sent before the snapshot: {sorted(noted_before)[:10]}"
        assert all(k.startswith(("rollback-a/", "root:rollback-a/")) for k in doubled), sorted(doubled)[:10]
        assert all(n == 2 for n in doubled.values()), doubled
        differ = {k: ids for k, ids in out.facts["copies"].items() if len(set(ids)) > 1}
        assert not differ, f"copies with other trace/span ids: {dict(list(differ.items())[:5])}"
        _ran_through(out)


class TestExportPostgres(ConsumerContract):
    consumer = PostgresConsumer()


class TestExportJsonl(ConsumerContract):
    consumer = JsonlConsumer()  # slow_target is not collected: JsonlConsumer.not_applicable says why



class TestArchive(ConsumerContract):
    consumer = ArchiveConsumer()  # poison is not collected: ArchiveConsumer.not_applicable says why

    @pytest.mark.timeout(WINDOW_TIMEOUT_S)
    def test_target_down(self, contract_outcomes):
        """e) for the log of record (issue 23: "the store down for 10 minutes: nothing trimmed that is
        not archived, 0 lost, readiness false"): beside the contract's checks, at the end of the
        outage every raw entry that arrived during it is still in Redis although the workers' raw
        trim (retention 0.36 s) ran through the outage and did remove the entries archived before."""
        super().test_target_down(contract_outcomes)
        out = self.outcome(contract_outcomes, "target_down")
        assert out.facts["unarchived_count"] > 0
        assert out.facts["unarchived_missing_from_redis"] == [], out.facts["unarchived_missing_from_redis"][:10]
        assert out.facts["archived_before_still_in_redis"] < out.facts["archived_before_count"], (
            "the trim removed nothing archived during the outage: the check above proves nothing", out.facts)

    # The broker's own faults (issue 32): a rollback only the archive survives whole (the others'
    # cost is what it counts and alerts on: docs/consumers.md "The broker's own faults"), and a
    # second archive is refused rather than run beside the first.
    @pytest.mark.timeout(WINDOW_TIMEOUT_S)
    def test_rollback(self, contract_outcomes):
        """Redis restarted from an older snapshot mid-stream: beside the contract's checks, what Redis
        lost the archive keeps (its account is over every run published, before and after: owed
        them all, ArchiveConsumer.owed_after_rollback), reported in one line and counted in
        goose_ingest_archive_broker_lost_entries_total, the alert's metric."""
        super().test_rollback(contract_outcomes)
        out = self.outcome(contract_outcomes, "rollback")
        assert out.facts["runs_owed"] == out.facts["runs_fed"], out.facts
        assert len(out.facts["rollback_lines"]) == 1, out.facts["rollback_lines"]
        # Counted exactly (GooseIngestBrokerLostEntries fires on any increase): every raw entry of B,
        # archived and then lost by Redis, although runs C were written (and archived) before the check.
        counted, lost = out.facts["broker_lost_counted"], out.facts["raw_entries_of_b"]
        assert counted == lost > 0, f"counted {counted} of {lost}: {out.facts['rollback_lines']}"

    def test_second_instance(self, contract_outcomes):
        """A second archive on the same group: refused with one line and exit 2; the first goes on,
        0 lost, 0 doubled."""
        out = self.outcome(contract_outcomes, "second_instance")
        assert out.facts["second_exit"] == 2, out.facts["second_exit"]
        refusals = [line for line in out.facts["second_log"].splitlines() if "another archive is running" in line]
        assert len(refusals) == 1 and "Traceback" not in out.facts["second_log"], out.facts["second_log"][-2000:]
        _lost_doubled(out)
        _ran_through(out)
