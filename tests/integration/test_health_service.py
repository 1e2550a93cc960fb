"""The health service on real NATS and Redis: quarantine with evidence and advice, operator cordon and release."""

from collections.abc import AsyncIterator
from typing import Any

import pytest
from litestar.testing import AsyncTestClient

from chamber.collector import service as collector
from chamber.common.bus import Bus
from chamber.common.contracts import GpuSample, NodeTelemetry
from chamber.common.runtime import make_context
from chamber.common.settings import Settings
from chamber.common.subjects import Names
from chamber.health import service as health
from tests.support.gateway import gateway_client
from tests.support.services import eventually, running

pytestmark = pytest.mark.integration


@pytest.fixture
async def client(settings: Settings, cleanup: None) -> AsyncIterator[AsyncTestClient[Any]]:
    async with gateway_client(settings) as c:
        yield c


async def test_quarantine_cordon_and_release(client: AsyncTestClient[Any], settings: Settings) -> None:
    bus = await Bus.connect(settings.nats_url, Names(settings.namespace), "test")
    ctx = make_context(settings, "test")
    ledger = ctx.ledger()
    try:
        async with running(settings, ("collector", collector.main), ("health", health.main)):

            async def known() -> bool:
                return (await client.get("/v1/nodes/node-0001")).status_code == 200

            await eventually(known, what="the node is known")
            bad = GpuSample(index=3, uuid="GPU-x", remapped_rows_failure=True)
            fault = NodeTelemetry(node="node-0001", sampled_at=ctx.clock.now(), interval_s=0.0, gpus=[bad])
            await bus.publish(bus.names.telemetry("node-0001"), fault)

            async def quarantined() -> bool:
                view = (await client.get("/v1/nodes/node-0001")).json()
                return bool(view["gpus"][3]["state"] == "quarantined")

            await eventually(quarantined, what="the GPU is quarantined")
            view = (await client.get("/v1/nodes/node-0001")).json()
            gpu = view["gpus"][3]
            assert gpu["action"] == "rma"
            assert "row-remap-failure" in gpu["reason"]
            assert gpu["history"][-1]["evidence"] == {"remapped_rows_failure": 1.0}
            assert view["node"]["gpus_unschedulable"] == 1
            assert (await ledger.snapshot()).cordoned["node-0001/3"].startswith("fatal")
            by_uuid = (await client.get(f"/v1/gpus/{view['gpus'][0]['uuid']}")).json()
            assert by_uuid["index"] == 0

            resp = await client.post("/v1/nodes/node-0002/cordon", json={"reason": "firmware update"})
            assert resp.status_code == 202

            async def node_out() -> bool:
                cordoned = (await ledger.snapshot()).cordoned
                return all(f"node-0002/{i}" in cordoned for i in range(8))

            await eventually(node_out, what="the operator's cordon takes the node out")
            assert (await client.post("/v1/nodes/node-0002/release", json={})).status_code == 202

            async def node_back() -> bool:
                cordoned = (await ledger.snapshot()).cordoned
                return not any(s.startswith("node-0002/") for s in cordoned)

            await eventually(node_back, what="release brings it back")
            assert (await client.post("/v1/nodes/nope/cordon", json={})).status_code == 404
            assert (await client.post("/v1/nodes/node-0002/cordon", json={"gpu": 99})).status_code == 400
            assert (await client.post("/v1/nodes/node-0002/cordon", json={"bogus": 1})).status_code == 400
    finally:
        await bus.close()
        await ledger.close()


async def test_a_fault_injected_into_the_simulated_fleet_moves_the_job(
    client: AsyncTestClient[Any], settings: Settings
) -> None:
    """The whole loop: simulated telemetry shows a DBE, health quarantines the GPU, the scheduler interrupts the
    job at once, and the job resumes on other hardware."""
    from chamber.scheduler import service as scheduler

    async with running(settings, ("collector", collector.main), ("health", health.main), ("scheduler", scheduler.main)):

        async def fleet_up() -> bool:
            return bool((await client.get("/v1/fleet")).json()["gpus_total"])

        await eventually(fleet_up, what="inventory")
        job = {"name": "pretrain", "team": "core", "gpus_per_replica": 8, "duration_s": 600, "priority": "train"}
        job_id = (await client.post("/v1/jobs", json=job)).json()["id"]

        async def view() -> dict[str, Any]:
            result: dict[str, Any] = (await client.get(f"/v1/jobs/{job_id}")).json()
            return result

        async def is_running() -> bool:
            return bool((await view())["state"] == "running")

        await eventually(is_running, what="job running")
        node = (await view())["placement"]["gpus"][0][0]
        assert (await client.post("/v1/sim/faults", json={"node": "nowhere", "fault": "dbe"})).status_code == 404
        assert (await client.post("/v1/sim/faults", json={"node": node, "fault": "gremlins"})).status_code == 400
        resp = await client.post("/v1/sim/faults", json={"node": node, "gpu": 2, "fault": "dbe"})
        assert resp.status_code == 202

        async def moved() -> bool:
            v = await view()
            return bool(v["state"] == "running" and v["attempt"] == 2)

        await eventually(moved, within=15, what="the job runs again elsewhere")
        v = await view()
        assert v["interruptions"] == 1
        assert f"{node}/2" not in {f"{n}/{i}" for n, i in v["placement"]["gpus"]}
        gpu = (await client.get(f"/v1/nodes/{node}")).json()["gpus"][2]
        assert gpu["state"] == "quarantined"
        assert gpu["action"] == "reset-gpu"
