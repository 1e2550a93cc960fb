"""The scheduler service end to end on real NATS and Redis: preemption with resume, and interruption by a fault."""

import pytest

from chamber.collector import service as collector
from chamber.common.bus import Bus
from chamber.common.contracts import GpuSample, JobRecord, JobSpec, JobSubmitted, NodeTelemetry
from chamber.common.jobstore import JobStore
from chamber.common.runtime import make_context
from chamber.common.settings import Settings
from chamber.health import service as health
from chamber.scheduler import service as scheduler
from tests.support.services import eventually, running

pytestmark = pytest.mark.integration


async def submit(bus: Bus, job_id: str, spec: JobSpec, at: float) -> None:
    await bus.publish(bus.names.job_submit(job_id), JobSubmitted(job_id=job_id, spec=spec, submitted_at=at))


async def record(store: JobStore, job_id: str) -> JobRecord | None:
    got = await store.get(job_id)
    return None if got is None else got[0]


async def test_training_preempts_research_which_resumes_and_finishes(settings: Settings, bus: Bus) -> None:
    store = await JobStore.open(bus)
    async with running(settings, ("collector", collector.main), ("scheduler", scheduler.main)):
        research = JobSpec(
            name="sweep", team="lab", gpus_per_replica=8, replicas=4, priority="research", duration_s=4.0,
            checkpoint_grace_s=0.3,
        )  # fmt: skip
        await submit(bus, "research", research, 1.0)

        async def is_state(job_id: str, state: str) -> bool:
            r = await record(store, job_id)
            return r is not None and r.state == state

        await eventually(lambda: is_state("research", "running"), what="research running on the whole fleet")
        train = JobSpec(name="llm", team="core", gpus_per_replica=8, priority="train", duration_s=0.5)
        await submit(bus, "train", train, 2.0)
        await eventually(lambda: is_state("research", "preempted"), what="research preempted")
        preempted = await record(store, "research")
        assert preempted is not None
        assert preempted.preemptions == 1
        assert "preempted by train" in preempted.stop_reason
        assert preempted.run_s > 0, "its work up to the checkpoint is kept"
        await eventually(lambda: is_state("train", "succeeded"), what="train ran and finished")
        await eventually(lambda: is_state("research", "succeeded"), within=20, what="research resumed and finished")
        done = await record(store, "research")
        assert done is not None
        assert done.attempt == 2


async def test_a_gpu_fault_interrupts_its_job_which_resumes_elsewhere(settings: Settings, bus: Bus) -> None:
    store = await JobStore.open(bus)
    async with running(settings, ("collector", collector.main), ("scheduler", scheduler.main), ("health", health.main)):
        spec = JobSpec(name="pretrain", team="core", gpus_per_replica=8, priority="train", duration_s=60.0)
        await submit(bus, "pretrain", spec, 1.0)

        async def placed() -> JobRecord | None:
            r = await record(store, "pretrain")
            return r if r is not None and r.state == "running" else None

        await eventually(placed, what="job running")
        first = await placed()
        assert first is not None
        assert first.placement is not None
        node = first.placement.gpus[0].node
        fault = GpuSample(index=5, uuid="GPU-bad", ecc_dbe_volatile=1)
        await bus.publish(
            bus.names.telemetry(node), NodeTelemetry(node=node, sampled_at=2.0, interval_s=1.0, gpus=[fault])
        )

        async def moved() -> bool:
            r = await record(store, "pretrain")
            return bool(r and r.state == "running" and r.attempt == 2)

        await eventually(moved, what="the job runs again after the fault")
        after = await record(store, "pretrain")
        assert after is not None
        assert after.placement is not None
        assert after.interruptions == 1
        assert f"{node}/5" not in {g.slot for g in after.placement.gpus}


async def test_a_job_submitted_again_after_it_ended_is_not_placed_again(settings: Settings, bus: Bus) -> None:
    """The scheduler keeps only active jobs in memory, so a submission of a job that already ended (a replay after
    a crash, a redelivery, a duplicate message) looks new to it. The store refuses the new record; the GPUs the
    pass claimed for it must be released at once, not left to the ledger check 10 s later (meanwhile nobody
    could use them, and with a full fleet the phantom could have preempted a real job)."""
    store = await JobStore.open(bus)
    ledger = make_context(settings, "test").ledger()
    try:
        async with running(settings, ("collector", collector.main), ("scheduler", scheduler.main)):
            spec = JobSpec(name="eval", team="lab", gpus_per_replica=8, duration_s=0.2)
            await submit(bus, "first", spec, 1.0)

            async def succeeded(job_id: str) -> bool:
                r = await record(store, job_id)
                return r is not None and r.state == "succeeded"

            await eventually(lambda: succeeded("first"), what="the job ran and ended")
            ended = await record(store, "first")
            await submit(bus, "first", spec, 1.0)  # the same submission again
            await submit(bus, "after", spec, 2.0)
            await eventually(lambda: succeeded("after"), what="the next job ran (the duplicate was handled before it)")
            claims = (await ledger.snapshot()).claims
            assert "first" not in claims, "the duplicate's claim was released at once"
            assert await record(store, "first") == ended, "the ended job's record is untouched"
    finally:
        await ledger.close()
