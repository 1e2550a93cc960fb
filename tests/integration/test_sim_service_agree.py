"""The simulator and the scheduler service share one set of semantics: fed the same events at the same times, they
place the same jobs on the same GPUs and preempt the same jobs, decision for decision.

The simulator runs a small trace on its virtual clock. The service's scheduler (real NATS KV, real Redis ledger)
is handed the same events, one instant at a time (as its consumer hands over a batch), by a harness that plays the
executor exactly as the simulator does (a placed job starts at once and finishes when its duration has run; a
preempted one stops after its grace), with the service's clock set to each instant.
"""

import asyncio
import heapq
import random
from typing import Any

import msgspec
import pytest

from chamber.common.bus import Bus
from chamber.common.clock import FakeClock
from chamber.common.contracts import (
    GpuDevice,
    JobFinished,
    JobRecord,
    JobStarted,
    JobStopped,
    JobSubmitted,
    Node,
    NodeInventory,
    Pool,
    TopologyLabels,
)
from chamber.common.jobstore import JobStore
from chamber.common.quotastore import QuotaStore
from chamber.common.runtime import make_context
from chamber.common.settings import Settings
from chamber.scheduler.service import Scheduler
from chamber.sim.engine import Simulation
from chamber.sim.scenario import Defaults, FleetSpec, PoolSpec, Scenario, TraceJob, WorkloadSpec

pytestmark = pytest.mark.integration

NODES, GPUS = 4, 8
START = 1_000_000.0


def trace(seed: int = 3, n: int = 40) -> list[TraceJob]:
    """Distinct arrival times, durations that never end on another event's instant, sizes up to a 2-node gang,
    and two priorities so that preemption happens."""
    rng = random.Random(seed)
    jobs = []
    t = 0.0
    for i in range(n):
        t += rng.uniform(5, 60) + 0.001 * i
        jobs.append(
            TraceJob(
                id=f"j{i:02d}", submit_s=round(t, 3), duration_s=round(rng.uniform(30, 400), 3) + 0.0007 * i,
                gpus=rng.choice([1, 2, 4, 8, 16]), team=rng.choice(["a", "b"]),
                priority=rng.choice(["train", "research", "research"]), preemptible=True,
            )
        )  # fmt: skip
    return jobs


def scenario() -> Scenario:
    return Scenario(
        name="agree",
        fleet=FleetSpec(pools=[PoolSpec(name="default", gpu_model="H100", nodes=NODES, gpus_per_node=GPUS)]),
        workload=WorkloadSpec(trace="-", defaults=Defaults(checkpoint_interval_s=None, checkpoint_grace_s=20.0)),
        cycle_interval_s=1e9,  # no safety-net cycles: both decide only on events
    )


def simulated(jobs: list[TraceJob]) -> list[tuple[Any, ...]]:
    sim = Simulation(scenario(), jobs, "chamber")
    decisions: list[tuple[Any, ...]] = []
    apply = sim._apply

    def recording(ds: list[Any]) -> None:
        for d in ds:
            if type(d).__name__ == "Place":
                decisions.append(("place", d.job_id, d.attempt, tuple(g.slot for g in d.gpus)))
            elif type(d).__name__ == "Preempt":
                decisions.append(("preempt", d.job_id, d.attempt))
        apply(ds)

    sim._apply = recording  # type: ignore[method-assign,assignment]
    sim.run()
    return decisions


class PlayedExecutor:
    """Plays the executor as the simulator does, on the harness's virtual timeline."""

    def __init__(self, clock: FakeClock, durations: dict[str, float], timeline: list[Any], log: list[Any]) -> None:
        self.clock = clock
        self.durations = durations
        self.timeline = timeline
        self.log = log
        self.seq = 0

    def at(self, t: float, event: Any) -> None:
        self.seq += 1
        heapq.heappush(self.timeline, (t, self.seq, event))

    async def launch(self, record: JobRecord) -> None:
        assert record.placement is not None
        now = self.clock.now() - START
        self.log.append(("place", record.id, record.attempt, tuple(g.slot for g in record.placement.gpus)))
        self.at(now, JobStarted(job_id=record.id, attempt=record.attempt, started_at=START + now))
        end = now + max(0.0, self.durations[record.id] - record.run_s)
        self.at(end, JobFinished(job_id=record.id, attempt=record.attempt, finished_at=START + end,
                                 started_at=START + now))  # fmt: skip

    async def stop(self, record: JobRecord, reason: str, grace_s: float = 0.0) -> None:
        now = self.clock.now() - START
        self.log.append(("preempt", record.id, record.attempt))
        self.at(now + grace_s, JobStopped(job_id=record.id, attempt=record.attempt, stopped_at=START + now + grace_s,
                                          reason=reason, graceful=grace_s > 0))  # fmt: skip

    async def resync(self, records: Any) -> None:
        return None

    async def close(self) -> None:
        return None


async def test_the_simulator_and_the_service_decide_alike(settings: Settings, bus: Bus) -> None:
    jobs = trace()
    expected = simulated(jobs)
    assert any(d[0] == "preempt" for d in expected), "the trace must exercise preemption"
    assert len([d for d in expected if d[0] == "place"]) > len(jobs), "and resumption"

    clock = FakeClock(START)
    ctx = make_context(msgspec.structs.replace(settings, schedule_interval_s=1e9), "scheduler", clock)
    for i in range(NODES):
        node = Node(
            name=f"default-{i:04d}", pool="default",
            gpus=[GpuDevice(index=g, uuid=f"GPU-{i}-{g}", model="H100") for g in range(GPUS)],
            topology=TopologyLabels(zone="zone-0", rack=f"rack-{i // 16}"),
        )  # fmt: skip
        pool = Pool(name="default", gpu_model="H100")
        await bus.publish(bus.names.inventory(node.name), NodeInventory(node=node, pool=pool, observed_at=START))
    timeline: list[Any] = []
    log: list[tuple[Any, ...]] = []
    sim = Simulation(scenario(), jobs, "chamber")
    durations = {j.trace.id: j.trace.duration_s for j in sim.jobs.values()}
    executor = PlayedExecutor(clock, durations, timeline, log)
    ledger = ctx.ledger()
    scheduler = Scheduler(
        ctx, bus, ledger, await JobStore.open(bus), executor,
        quota_store=await QuotaStore.open(bus),
    )  # fmt: skip
    await scheduler.start()
    for job in sim.jobs.values():
        at = job.trace.submit_s
        executor.at(at, JobSubmitted(job_id=job.trace.id, spec=job.spec, submitted_at=START + at))
    try:
        while timeline:
            t = timeline[0][0]
            clock.advance(START + t - clock.now())
            batch = []
            while timeline and timeline[0][0] == t:
                batch.append(heapq.heappop(timeline)[2])
            await scheduler.on_events(batch)  # what the consumer hands over: everything of one instant at once
            await asyncio.gather(*scheduler._executing)
    finally:
        await scheduler.close()
        await ledger.close()
    assert log == expected, _first_difference(log, expected)


def _first_difference(got: list[Any], want: list[Any]) -> str:
    i = next((k for k, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), min(len(got), len(want)))
    lines = [f"first difference at decision {i} (service | simulator):"]
    for k in range(max(0, i - 4), min(max(len(got), len(want)), i + 4)):
        a = got[k] if k < len(got) else "-"
        b = want[k] if k < len(want) else "-"
        lines.append(f"{k:3d} {'!=' if a != b else '=='} {_short(a)} | {_short(b)}")
    return "\n".join(lines)


def _short(d: Any) -> str:
    if isinstance(d, tuple) and d[0] == "place":
        nodes = sorted({slot.rsplit("/", 1)[0][-1] + "/" + slot.rsplit("/", 1)[1] for slot in d[3]})
        return f"place {d[1]}#{d[2]} {','.join(nodes)[:40]}"
    return str(d)
