"""Every consumer rejects garbage and wrong-schema messages, dead-letters them, and keeps working."""

import pytest

from chamber.collector import service as collector
from chamber.common.bus import Bus
from chamber.common.codec import Decoder
from chamber.common.contracts import (
    GpuSample,
    JobSpec,
    JobSubmitted,
    NodeTelemetry,
    QuotaState,
    to_columns,
)
from chamber.common.jobstore import JobStore
from chamber.common.ledger import Ledger
from chamber.common.settings import Settings
from chamber.common.subjects import DEADLETTER, JOBS_BUCKET, QUOTA, Names
from chamber.health import service as health
from chamber.quota import service as quota
from chamber.scheduler import service as scheduler
from tests.support.services import eventually, running

pytestmark = pytest.mark.integration

GARBAGE = [
    b"",
    b"\x00\xff\xfe",
    b"not json at all",
    b"[1, 2, 3]",
    b'{"kind": "NoSuchEvent", "v": 1}',
    b'{"kind": "JobSubmitted", "job_id": 7}',
    b'{"kind": "JobSubmitted", "job_id": "x", "submitted_at": 1, "spec": {"name": "a", "team": "t", '
    b'"gpus_per_replica": -5}}',
    b'{"kind": "NodeTelemetry", "node": "n", "gpus": "many"}',
    b'{"kind": "NodeTelemetryColumns", "node": "n", "sampled_at": 1, "interval_s": 1, "index": [0, 1], "uuid": ["a"]}',
    b'{"kind": "NodeTelemetryColumns", "node": "n", "sampled_at": 1, "interval_s": 1, "index": [0], "uuid": ["a"], '
    b'"gpu_util": [1, 2, 3]}',
    b'{"kind": "JobStateChanged", "record": null}',
    b'{"a": ' * 10_000,
]


async def test_services_survive_garbage(settings: Settings, cleanup: None) -> None:
    names = Names(settings.namespace)
    bus = await Bus.connect(settings.nats_url, names, "test")
    await bus.ensure_streams()
    ledger = Ledger.from_url(settings.redis_url, names.redis_prefix())
    store = await JobStore.open(bus)
    subjects = [
        names.job_submit("bad"),
        names.job_lifecycle("bad"),
        names.telemetry("node-0000"),
        names.decision_placed("bad"),
        f"$KV.{names.bucket(JOBS_BUCKET)}.bad",  # a record that is not one: every follower of the bucket reads it
        names.inventory("node-bad"),
        names.quota_state(),
    ]
    try:
        async with running(
            settings,
            ("collector", collector.main),
            ("scheduler", scheduler.main),
            ("health", health.main),
            ("quota", quota.main),
        ):
            for subject in subjects:
                for payload in GARBAGE:
                    await bus.publish_raw(subject, payload)

            # The scheduler still schedules.
            spec = JobSpec(name="ok", team="survivors", gpus_per_replica=2, duration_s=30)
            await bus.publish(names.job_submit("good"), JobSubmitted(job_id="good", spec=spec, submitted_at=1.0))

            async def good_running() -> bool:
                got = await store.get("good")
                return got is not None and got[0].state == "running"

            await eventually(good_running, what="a valid job runs after the garbage")

            # Health still quarantines.
            bad_gpu = GpuSample(index=3, uuid="GPU-x", ecc_dbe_volatile=2)
            await bus.publish(
                names.telemetry("node-0001"),
                to_columns(NodeTelemetry(node="node-0001", sampled_at=2.0, interval_s=1.0, gpus=[bad_gpu])),
            )

            async def cordoned() -> bool:
                return "node-0001/3" in (await ledger.snapshot()).cordoned

            await eventually(cordoned, what="a DBE quarantines the GPU after the garbage")

            # Quota still publishes.
            async def quota_sees_team() -> bool:
                states = await bus.read_latest(QUOTA, names.quota_state(), Decoder(QuotaState))
                return any(s.teams.get("survivors") and s.teams["survivors"].jobs_running == 1 for s in states)

            await eventually(quota_sees_team, what="quota state counts the job after the garbage")

            info = await bus.js.stream_info(names.stream(DEADLETTER))
            consumed = 3  # jobs.submit, jobs.lifecycle (scheduler), telemetry (health); quota follows the KV
            assert info.state.messages == consumed * len(GARBAGE)
    finally:
        await bus.close()
        await ledger.close()
