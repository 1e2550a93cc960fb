"""The quota service and the team and pool API on real NATS and Redis."""

import types
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import nats.errors
import nats.js.errors
import pytest
from litestar.testing import AsyncTestClient

from chamber.collector import service as collector
from chamber.common.bus import Bus
from chamber.common.codec import Decoder
from chamber.common.contracts import QuotaState, SchedulerStats
from chamber.common.settings import Settings
from chamber.common.subjects import QUOTA, Names
from chamber.quota import service as quota
from chamber.scheduler import service as scheduler
from tests.support.gateway import gateway_client
from tests.support.services import eventually, running

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).parents[2] / "deploy" / "examples" / "quota.yaml"


@pytest.fixture
async def client(settings: Settings, cleanup: None) -> AsyncIterator[AsyncTestClient[Any]]:
    async with gateway_client(settings) as c:
        yield c


async def test_the_example_configuration_seeds_the_quota_service(
    client: AsyncTestClient[Any], settings: Settings
) -> None:
    seeded = msgspec.structs.replace(settings, quota_file=str(EXAMPLE), fleet_nodes=16)
    async with running(seeded, ("collector", collector.main), ("quota", quota.main)):

        async def has_teams() -> bool:
            return len((await client.get("/v1/teams")).json()) == 3

        await eventually(has_teams, what="the seeded teams are served")
        nlp = (await client.get("/v1/teams/nlp")).json()
        assert nlp["config"]["weight"] == 2
        assert nlp["usage"]["nominal"] == 48

        async def orgs() -> bool:
            return {o["org"] for o in (await client.get("/v1/orgs")).json()} == {"acme", "research", "product"}

        await eventually(orgs, what="organisation sums are published")
        acme = next(o for o in (await client.get("/v1/orgs")).json() if o["org"] == "acme")
        assert acme["nominal"] == 112, "the root sums every team below it"
        pools = (await client.get("/v1/pools")).json()
        assert pools[0]["name"] == "default"
        assert pools[0]["nominal_total"] == 112


async def test_invalid_changes_are_rejected_and_the_old_configuration_stays(client: AsyncTestClient[Any]) -> None:
    assert (await client.put("/v1/pools/h100", json={"gpu_model": "H100", "capacity": 16})).status_code == 200
    ok = await client.put("/v1/teams/a", json={"org": "acme", "quotas": [{"pool": "h100", "nominal": 8}]})
    assert ok.status_code == 422, "organisation acme does not exist yet"
    assert "unknown organisation" in ok.text
    # Organisations come with the configuration file; here we add one team per valid change.
    bad = [
        ({"org": "acme", "quotas": [{"pool": "h100", "nominal": -1}]}, "nominal"),
        ({"org": "acme", "weight": 0}, "weight"),
        ({"org": "acme", "surprise": 1}, "surprise"),
    ]
    for body, word in bad:
        resp = await client.put("/v1/teams/a", json=body)
        assert resp.status_code == 400, resp.text
        assert word in resp.text
    assert (await client.get("/v1/teams/a")).status_code == 404, "nothing half-written"
    assert (await client.get("/v1/pools/h100")).json()["config"]["capacity"] == 16


async def test_guarantees_above_capacity_are_rejected(client: AsyncTestClient[Any], settings: Settings) -> None:
    from chamber.common.bus import Bus
    from chamber.common.contracts import OrgConfig, PoolConfig, QuotaConfig
    from chamber.common.quotastore import QuotaStore
    from chamber.common.subjects import Names

    bus = await Bus.connect(settings.nats_url, Names(settings.namespace), "test")
    store = await QuotaStore.open(bus)
    await store.put(QuotaConfig(pools=[PoolConfig(name="p", gpu_model="H100", capacity=16)],
                                orgs=[OrgConfig(name="o")]), 0)  # fmt: skip
    await bus.close()
    assert (
        await client.put("/v1/teams/x", json={"org": "o", "quotas": [{"pool": "p", "nominal": 10}]})
    ).status_code == 200
    resp = await client.put("/v1/teams/y", json={"org": "o", "quotas": [{"pool": "p", "nominal": 10}]})
    assert resp.status_code == 422
    assert "above its capacity" in resp.text
    assert [t["name"] for t in (await client.get("/v1/teams")).json()] == ["x"]


async def test_an_exhausted_budget_blocks_new_work(
    client: AsyncTestClient[Any], settings: Settings, tmp_path: Path
) -> None:
    cfg = tmp_path / "quota.yaml"
    cfg.write_text(
        "pools: [{name: default, gpu_model: H100, cost_per_gpu_hour: 3600}]\n"
        "orgs: [{name: o}]\n"
        "teams: [{name: a, org: o, quotas: [{pool: default, nominal: 32}],"
        " budget: {money: 1, period: day, mode: block-all}}]\n"
    )
    seeded = msgspec.structs.replace(settings, quota_file=str(cfg))
    async with running(seeded, ("collector", collector.main), ("quota", quota.main), ("scheduler", scheduler.main)):

        async def fleet_up() -> bool:
            return bool((await client.get("/v1/fleet")).json()["gpus_total"])

        await eventually(fleet_up, what="inventory")
        job = {"name": "spender", "team": "a", "gpus_per_replica": 1, "duration_s": 1.5, "priority": "train"}
        first = (await client.post("/v1/jobs", json=job)).json()

        async def state_of(job_id: str) -> str:
            return str((await client.get(f"/v1/jobs/{job_id}")).json()["state"])

        await eventually(lambda: _is(state_of(first["id"]), "succeeded"), what="the first job ran")

        async def blocked() -> bool:
            return bool((await client.get("/v1/teams/a")).json()["usage"]["budget_state"] == "blocked-all")

        await eventually(blocked, what="the budget is exhausted")
        # The scheduler hears the quota state on its own subscription, which may come after the gateway's: the
        # next job is submitted once the scheduler reports deciding under a state that blocks the team.
        bus = await Bus.connect(settings.nats_url, Names(settings.namespace), "test")
        try:
            latest = await bus.read_latest(QUOTA, bus.names.quota_state(), Decoder(QuotaState))
            assert latest
            assert latest[-1].teams["a"].budget_state == "blocked-all"
            reports: list[SchedulerStats] = []

            async def on_stats(msg: Any) -> None:
                reports.append(msgspec.json.decode(msg.data, type=SchedulerStats))

            await bus.nc.subscribe(bus.names.scheduler_stats(), cb=on_stats)

            async def scheduler_knows() -> bool:
                return any(r.quota_at is not None and r.quota_at >= latest[-1].computed_at for r in reports)

            await eventually(scheduler_knows, what="the scheduler decides under the blocking quota state")
        finally:
            await bus.close()
        second = (await client.post("/v1/jobs", json=job)).json()

        async def waits_for_budget() -> bool:
            got = (await client.get(f"/v1/jobs/{second['id']}")).json()
            return got["state"] == "pending" and "budget" in got["reason"]

        await eventually(waits_for_budget, what="the next job waits for budget")


async def _is(awaitable: Any, expected: str) -> bool:
    return bool(await awaitable == expected)


async def test_the_durable_consumer_older_versions_left_on_decisions_is_deleted(
    settings: Settings, cleanup: None
) -> None:
    """Quota follows the job records now; the `decisions.state` consumer of older versions would sit on DECISIONS
    unacked for ever."""
    from nats.js.api import AckPolicy, ConsumerConfig

    from chamber.common.bus import Bus
    from chamber.common.subjects import DECISIONS, Names

    names = Names(settings.namespace)
    bus = await Bus.connect(settings.nats_url, names, "test")
    try:
        await bus.ensure_streams()
        stream = names.stream(DECISIONS)
        await bus.js.add_consumer(
            stream, ConsumerConfig(durable_name=quota.OLD_CONSUMER, ack_policy=AckPolicy.EXPLICIT)
        )
        async with running(settings, ("quota", quota.main)):

            async def gone() -> bool:
                return not [c for c in await bus.js.consumers_info(stream) if c.name == quota.OLD_CONSUMER]

            await eventually(gone, what="the old consumer is deleted")
    finally:
        await bus.close()


@pytest.mark.parametrize(
    "error",
    [nats.errors.TimeoutError(), nats.js.errors.ServiceUnavailableError(code=503, description="JetStream not ready")],
)
async def test_a_failed_cleanup_of_the_old_consumer_does_not_stop_the_service(error: Exception) -> None:
    """The cleanup is optional: an account that may not delete consumers, or a leader election, only leaves it."""

    async def delete_consumer(stream: str, name: str) -> bool:
        raise error

    q = quota.Quota.__new__(quota.Quota)
    q.bus = types.SimpleNamespace(  # type: ignore[assignment]
        js=types.SimpleNamespace(delete_consumer=delete_consumer),
        names=types.SimpleNamespace(stream=lambda spec: "NS_DECISIONS"),
    )
    await q._drop_old_consumer()


async def test_ended_jobs_settle_and_a_new_price_reads_them_again(
    client: AsyncTestClient[Any], settings: Settings
) -> None:
    """The service keeps only the records of jobs that have not ended; an ended job's GPU time stays in the sums
    (read at start, or followed), and a new configuration reads every record again, so a new price applies to all
    of them, as the from-scratch definition says."""
    import time

    from chamber.common.bus import Bus
    from chamber.common.contracts import (
        JobRecord,
        JobSpec,
        JobState,
        OrgConfig,
        PoolConfig,
        QuotaConfig,
        TeamConfig,
        TeamQuota,
    )
    from chamber.common.jobstore import JobStore
    from chamber.common.quotastore import QuotaStore
    from chamber.common.subjects import Names

    def ended(job_id: str) -> JobRecord:
        at = time.time() - 7200
        spec = JobSpec(name=job_id, team="a", gpus_per_replica=1, pool="p")
        return JobRecord(id=job_id, spec=spec, state=JobState.SUCCEEDED, submitted_at=at, updated_at=at + 3600,
                         version=3, started_at=at, finished_at=at + 3600, run_s=3600.0)  # fmt: skip

    def config(price: float) -> QuotaConfig:
        return QuotaConfig(pools=[PoolConfig(name="p", gpu_model="H100", capacity=8, cost_per_gpu_hour=price)],
                           orgs=[OrgConfig(name="o")],
                           teams=[TeamConfig(name="a", org="o", quotas=[TeamQuota(pool="p", nominal=4)])])  # fmt: skip

    bus = await Bus.connect(settings.nats_url, Names(settings.namespace), "test")
    try:
        quotas = await QuotaStore.open(bus)
        revision = await quotas.put(config(2.0), 0)
        records = await JobStore.open(bus)
        for job_id in ("e1", "e2", "e3"):
            assert await records.create(ended(job_id)) is not None

        async def usage_is(hours: float, cost: float) -> bool:
            usage = (await client.get("/v1/teams/a")).json()["usage"]
            return bool(usage["gpu_hours"] == hours and usage["cost"] == cost)

        async with running(settings, ("quota", quota.main)):
            await eventually(lambda: usage_is(3.0, 6.0), what="the ended jobs read at start are summed")
            assert await records.create(ended("e4")) is not None
            await eventually(lambda: usage_is(4.0, 8.0), what="an ended job followed is summed")
            await quotas.put(config(3.0), revision)
            await eventually(lambda: usage_is(4.0, 12.0), what="the new price applies to every ended job")
    finally:
        await bus.close()


def test_what_a_node_change_costs_depends_on_what_the_accounting_let_go() -> None:
    """A node new to the inventory re-sums only the jobs kept; one that moved to another pool, or that a settled job
    ran on before it was known, makes the service read every record again (their sums would be wrong)."""
    from chamber.common.contracts import (
        GpuRef,
        JobRecord,
        JobSpec,
        JobState,
        Node,
        NodeInventory,
        Placement,
        Pool,
        QuotaConfig,
    )
    from chamber.common.quota import QuotaBook
    from chamber.quota.core.accounting import Accounting

    def inventory(name: str, pool: str) -> NodeInventory:
        return NodeInventory(node=Node(name=name, pool=pool, gpus=[]), pool=Pool(name=pool, gpu_model="H100"),
                             observed_at=0.0)  # fmt: skip

    q = quota.Quota.__new__(quota.Quota)
    q.node_pool, q.node_gpus = {"n1": "p"}, {}
    q.accounting = Accounting(QuotaBook(QuotaConfig()), q.node_pool, 100.0)
    ended = JobRecord(id="j", spec=JobSpec(name="j", team="t", gpus_per_replica=1), state=JobState.SUCCEEDED,
                      submitted_at=0.0, updated_at=50.0, started_at=0.0, finished_at=50.0, run_s=50.0,
                      placement=Placement(attempt=1, gpus=[GpuRef("n9", 0)]))  # fmt: skip
    q.accounting.apply(ended, 100.0)
    cases = [("n2", "p", (False, True)), ("n1", "q", (True, False)), ("n9", "p", (True, False))]
    for name, pool, flags in cases:
        q._reload = q._new_nodes = False
        q._on_inventory(inventory(name, pool))
        assert (q._reload, q._new_nodes) == flags, name
    q._reload = q._new_nodes = False
    q._on_inventory(inventory("n2", "p"))
    assert (q._reload, q._new_nodes) == (False, False), "the same inventory again changes nothing"


def test_the_writes_followed_in_a_second_are_taken_in_once_a_job() -> None:
    """A job placed, started and ended between two publications is taken in once, as its last record, and sums to
    what the three writes taken in one by one sum to; a write the records read at start hold already is skipped
    (taken in again, a settled job would be counted twice)."""
    from chamber.common.contracts import GpuRef, JobRecord, JobSpec, JobState, Placement, QuotaConfig
    from chamber.common.quota import QuotaBook
    from chamber.quota.core.accounting import Accounting
    from tests.unit.quota.test_accounting import assert_same

    placement = Placement(attempt=1, gpus=[GpuRef("n1", 0), GpuRef("n1", 1)])
    spec = JobSpec(name="j", team="t", gpus_per_replica=2)
    writes = [
        JobRecord(id="j", spec=spec, state=JobState.RUNNING, submitted_at=0.0, updated_at=1.0, placement=placement,
                  version=1),  # placed, not started yet
        JobRecord(id="j", spec=spec, state=JobState.RUNNING, submitted_at=0.0, updated_at=2.0, started_at=2.0,
                  placement=placement, version=2),
        JobRecord(id="j", spec=spec, state=JobState.SUCCEEDED, submitted_at=0.0, updated_at=50.0, started_at=2.0,
                  finished_at=50.0, run_s=48.0, placement=placement, version=3),
    ]  # fmt: skip
    one_by_one = Accounting(QuotaBook(QuotaConfig()), {"n1": "p"}, 100.0)
    for record in writes:
        one_by_one.apply(record, 100.0)

    q = quota.Quota.__new__(quota.Quota)
    q.ctx = types.SimpleNamespace(clock=types.SimpleNamespace(now=lambda: 100.0))  # type: ignore[assignment]
    q.accounting = Accounting(QuotaBook(QuotaConfig()), {"n1": "p"}, 100.0)
    q._arrived, q._read_up_to = {}, 10
    q._on_entry("j", writes[2], 9)  # read at start already
    q.take_arrived()
    assert not q.accounting.teams(100.0)
    for sequence, record in zip((11, 12, 13), writes, strict=True):
        q._on_entry("j", record, sequence)
    assert list(q._arrived.values()) == [writes[2]]
    q.take_arrived()
    assert_same(q.accounting.teams(100.0), one_by_one.teams(100.0))
    assert q.accounting.teams(100.0)["t"].gpu_hours == pytest.approx(2 * 48 / 3600, abs=1e-4)
    assert not q._arrived
