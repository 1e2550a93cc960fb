"""The quota shell: follow every job state change, keep per-team usage, publish the quota state on change."""

import asyncio

from chamber.common.bus import Bus, PublishError
from chamber.common.codec import Decoder
from chamber.common.contracts import JobRecord, JobStateChanged, QuotaState
from chamber.common.jobstore import JobStore
from chamber.common.log import get_logger
from chamber.common.runtime import Context, wait_event
from chamber.common.subjects import DECISIONS, JOBS_BUCKET
from chamber.quota.core.usage import team_usage

log = get_logger(__name__)

PUBLISH_INTERVAL_S = 1.0


class Quota:
    def __init__(self, ctx: Context, bus: Bus, store: JobStore) -> None:
        self.ctx = ctx
        self.bus = bus
        self.store = store
        self.records: dict[str, JobRecord] = {}
        self._published: QuotaState | None = None

    async def start(self) -> None:
        self.records = {job_id: rec for job_id, (rec, _) in (await self.store.load_all()).items()}
        consumer = self.bus.consumer(
            stream=DECISIONS,
            durable="quota",
            filter_subjects=[self.bus.names.subject("decisions.state.>")],
            decoder=Decoder(JobStateChanged),
            handler=self.on_state_changed,
        )
        await consumer.start()

    async def on_state_changed(self, event: JobStateChanged) -> None:
        known = self.records.get(event.record.id)
        if known is None or known.version < event.record.version:
            self.records[event.record.id] = event.record

    async def publish(self) -> None:
        teams = team_usage(self.records.values())
        if self._published is not None and self._published.teams == teams:
            return
        state = QuotaState(teams=teams, computed_at=self.ctx.clock.now())
        await self.bus.publish(self.bus.names.quota_state(), state)
        self._published = state

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.publish()
            except PublishError as exc:
                log.warning("quota.publish_failed", error=str(exc))
            await wait_event(stop, PUBLISH_INTERVAL_S)


async def main(ctx: Context, stop: asyncio.Event) -> None:
    bus = await ctx.bus()
    quota = Quota(ctx, bus, JobStore(await bus.key_value(JOBS_BUCKET)))
    try:
        await quota.start()
        await quota.run(stop)
    finally:
        await bus.close()
