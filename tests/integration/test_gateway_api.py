"""The HTTP API against real NATS and Redis: validation, the job lifecycle, the fleet, OpenAPI."""

import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
from litestar.testing import AsyncTestClient

from chamber.collector import service as collector
from chamber.common.bus import Bus
from chamber.common.contracts import (
    GpuDevice,
    GpuRef,
    JobRecord,
    JobSpec,
    JobState,
    Node,
    NodeInventory,
    Placement,
    Pool,
)
from chamber.common.jobstore import JobStore
from chamber.common.ledger import Claim, Ledger
from chamber.common.runtime import make_context
from chamber.common.settings import Settings
from chamber.scheduler import service as scheduler
from tests.support.gateway import gateway_client
from tests.support.services import eventually, running

pytestmark = pytest.mark.integration

JOB = {"name": "train-llm", "team": "ml", "gpus_per_replica": 4, "replicas": 2, "priority": "train", "duration_s": 0.5}


@pytest.fixture
async def client(settings: Settings, cleanup: None) -> AsyncIterator[AsyncTestClient[Any]]:
    async with gateway_client(settings) as c:
        yield c


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({**JOB, "gpus_per_replica": 0}, "gpus_per_replica"),
        ({**JOB, "replicas": -1}, "replicas"),
        ({**JOB, "team": "Bad Team!"}, "team"),
        ({**JOB, "priority": "urgent"}, "use one of best-effort, inference, research, train"),
        ({**JOB, "duration_s": "soon"}, "duration_s"),
        ({**JOB, "gpu": 3}, "gpu"),
        ({k: v for k, v in JOB.items() if k != "name"}, "name"),
    ],
    ids=[
        "zero-gpus",
        "negative-replicas",
        "bad-team",
        "unknown-priority",
        "bad-duration",
        "unknown-field",
        "missing-name",
    ],
)
async def test_invalid_submissions_are_rejected_with_a_clear_message(
    client: AsyncTestClient[Any], body: dict[str, Any], message: str
) -> None:
    resp = await client.post("/v1/jobs", json=body)
    assert resp.status_code == 400, resp.text
    assert message in resp.text
    assert (await client.get("/v1/jobs")).json() == [], "nothing half-written"


async def test_malformed_json_is_rejected(client: AsyncTestClient[Any]) -> None:
    resp = await client.post("/v1/jobs", content=b"{not json", headers={"content-type": "application/json"})
    assert resp.status_code == 400


async def test_an_accepted_job_is_visible_before_the_scheduler_sees_it(client: AsyncTestClient[Any]) -> None:
    resp = await client.post("/v1/jobs", json=JOB)
    assert resp.status_code == 201, resp.text
    job = resp.json()
    assert job["state"] == "pending"
    got = await client.get(f"/v1/jobs/{job['id']}")
    assert got.status_code == 200
    assert got.json()["state"] == "pending"


async def test_unknown_jobs_are_404(client: AsyncTestClient[Any]) -> None:
    assert (await client.get("/v1/jobs/nope")).status_code == 404
    assert (await client.delete("/v1/jobs/nope")).status_code == 404


async def test_openapi_and_health(client: AsyncTestClient[Any]) -> None:
    spec = (await client.get("/openapi.json")).json()
    assert {"/v1/jobs", "/v1/jobs/{job_id}", "/v1/fleet", "/v1/nodes", "/healthz"} <= set(spec["paths"])
    assert (await client.get("/healthz")).json() == {"status": "ok"}


async def test_a_job_runs_succeeds_and_the_fleet_shows_it(client: AsyncTestClient[Any], settings: Settings) -> None:
    async with running(settings, ("collector", collector.main), ("scheduler", scheduler.main)):
        await eventually(lambda: _fleet_total(client), what="inventory reaches the gateway")
        job = (await client.post("/v1/jobs", json={**JOB, "duration_s": 1.0})).json()

        async def state() -> str:
            return str((await client.get(f"/v1/jobs/{job['id']}")).json()["state"])

        await eventually(lambda: _is(state, "running"), within=5, what="job running")
        fleet = (await client.get("/v1/fleet")).json()
        assert fleet["gpus_total"] == 32
        assert fleet["gpus_allocated"] == 8
        nodes = (await client.get("/v1/nodes")).json()
        assert sum(n["gpus_allocated"] for n in nodes) == 8
        await eventually(lambda: _is(state, "succeeded"), within=10, what="job succeeded")
        final = (await client.get(f"/v1/jobs/{job['id']}")).json()
        assert len(final["placement"]["gpus"]) == 8
        assert (await client.delete(f"/v1/jobs/{job['id']}")).status_code == 409
        assert (await client.get("/v1/fleet")).json()["gpus_allocated"] == 0
        logs = await client.get(f"/v1/jobs/{job['id']}/logs")  # the simulated executor runs no process
        assert logs.status_code == 404, logs.text
        assert logs.json()["code"] == "no-output"
        assert "simulated executor" in logs.json()["detail"]


async def test_cancelling_a_running_job_frees_its_gpus(client: AsyncTestClient[Any], settings: Settings) -> None:
    async with running(settings, ("collector", collector.main), ("scheduler", scheduler.main)):
        await eventually(lambda: _fleet_total(client), what="inventory")
        job = (await client.post("/v1/jobs", json={**JOB, "duration_s": None})).json()

        async def state() -> str:
            return str((await client.get(f"/v1/jobs/{job['id']}")).json()["state"])

        await eventually(lambda: _is(state, "running"), within=5, what="job running")
        resp = await client.delete(f"/v1/jobs/{job['id']}")
        assert resp.status_code == 202
        await eventually(lambda: _is(state, "cancelled"), within=5, what="job cancelled")
        assert (await client.get("/v1/fleet")).json()["gpus_allocated"] == 0


async def _fleet_total(client: AsyncTestClient[Any]) -> bool:
    return bool((await client.get("/v1/fleet")).json()["gpus_total"])


async def _is(state: Any, expected: str) -> bool:
    return bool(await state() == expected)


@pytest.mark.parametrize("state", [JobState.SUCCEEDED, JobState.PREEMPTED, JobState.PENDING])
async def test_a_job_read_as_having_given_its_gpus_back_no_longer_shows_them_held(
    client: AsyncTestClient[Any], settings: Settings, bus: Bus, state: JobState
) -> None:
    """The scheduler writes a job's end, or its stop or requeue (no placement), before it releases the attempt's
    GPUs in the ledger (a crash in between must never free GPUs under a record that still holds them): a client
    that has read the record does not then see the GPUs held in the fleet, though the ledger holds them a moment."""
    async with _one_node(settings, bus, Claim("x", 1, ("n1/0", "n1/1"))) as (ledger, store):
        now = time.time()
        running_record = JobRecord(
            id="x", spec=JobSpec(name="x", team="ml", gpus_per_replica=2), state=JobState.RUNNING, submitted_at=now,
            updated_at=now, attempt=1, placement=Placement(attempt=1, gpus=[GpuRef("n1", 0), GpuRef("n1", 1)]),
            started_at=now,
        )  # fmt: skip
        revision = await store.create(running_record)
        assert revision is not None
        await eventually(lambda: _allocated(client, 2), what="the running job's GPUs held")
        placement = running_record.placement if state == JobState.SUCCEEDED else None
        given_back = msgspec.structs.replace(running_record, state=state, placement=placement, updated_at=time.time(),
                                             version=running_record.version + 1)  # fmt: skip
        await store.update(given_back, revision)
        assert (await client.get("/v1/jobs/x")).json()["state"] == state.value
        assert (await client.get("/v1/fleet")).json()["gpus_allocated"] == 0
        assert sum(n["gpus_allocated"] for n in (await client.get("/v1/nodes")).json()) == 0
        assert set((await ledger.snapshot()).claims) == {"x"}, "(the ledger has not released them yet)"


async def test_a_new_attempts_claim_shows_before_its_record_says_placed(
    client: AsyncTestClient[Any], settings: Settings, bus: Bus
) -> None:
    """The scheduler claims a job's next attempt before it writes the placement: a record still at the attempt
    before (preempted, no placement) does not hide the new claim."""
    async with _one_node(settings, bus, Claim("x", 2, ("n1/2", "n1/3"))) as (_, store):
        now = time.time()
        record = JobRecord(id="x", spec=JobSpec(name="x", team="ml", gpus_per_replica=2), state=JobState.PREEMPTED,
                           submitted_at=now, updated_at=now, attempt=1, placement=None)  # fmt: skip
        assert await store.create(record) is not None
        assert (await client.get("/v1/jobs/x")).json()["state"] == "preempted"
        await eventually(lambda: _allocated(client, 2), what="the new attempt's claim shown")


@contextlib.asynccontextmanager
async def _one_node(settings: Settings, bus: Bus, claim: Claim) -> AsyncIterator[tuple[Ledger, JobStore]]:
    """A node of 4 GPUs in the inventory, and a ledger holding `claim` alone."""
    gpus = [GpuDevice(index=i, uuid=f"GPU-n1-{i}", model="H100") for i in range(4)]
    inventory = NodeInventory(node=Node(name="n1", pool="default", gpus=gpus),
                              pool=Pool(name="default", gpu_model="H100"), observed_at=time.time())  # fmt: skip
    await bus.publish(bus.names.inventory("n1"), inventory)
    ledger = make_context(settings, "scheduler").ledger()
    try:
        await ledger.rebuild([claim])
        yield ledger, await JobStore.open(bus)
    finally:
        await ledger.close()


async def _allocated(client: AsyncTestClient[Any], n: int) -> bool:
    return bool((await client.get("/v1/fleet")).json()["gpus_allocated"] == n)
