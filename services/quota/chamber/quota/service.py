"""The quota shell: own the quota configuration, follow every job, publish per-team quota state.

At start the configuration is seeded from `CHAMBER_QUOTA_FILE` into the quota KV bucket if none is stored yet;
afterwards the KV is the truth (admins change it through the gateway). Usage and spend come from the job records,
so a restart recomputes them exactly: at start from all records, then one state change at a time
(`chamber.quota.core.accounting`); a new configuration or a node changing pool rebuilds the sums once.
"""

import asyncio
from collections.abc import Callable
from typing import Any

from chamber.common.bus import Bus, PublishError
from chamber.common.codec import Decoder
from chamber.common.contracts import JobRecord, JobStateChanged, NodeInventory, QuotaConfig, QuotaState
from chamber.common.jobstore import JobStore
from chamber.common.log import get_logger
from chamber.common.quota import ConfigError, QuotaBook, validate
from chamber.common.quotastore import QuotaStore, load_yaml
from chamber.common.runtime import Context, wait_event
from chamber.common.subjects import DECISIONS, QUOTA_BUCKET
from chamber.quota.core.accounting import Accounting
from chamber.quota.core.report import org_totals

log = get_logger(__name__)

PUBLISH_INTERVAL_S = 1.0
REFRESH_S = 10.0


class Quota:
    def __init__(self, ctx: Context, bus: Bus, store: JobStore, config_store: QuotaStore) -> None:
        self.ctx = ctx
        self.bus = bus
        self.store = store
        self.config_store = config_store
        self.config = QuotaConfig()
        self.accounting = Accounting(QuotaBook(self.config), {}, ctx.clock.now())
        self._stale = False
        """The configuration or a node's pool changed since the accounting was built."""
        self.node_pool: dict[str, str] = {}
        self.node_gpus: dict[str, int] = {}
        self._published: QuotaState | None = None
        self._stop_follow: Callable[[], Any] | None = None

    async def start(self) -> None:
        await self.bootstrap()
        self._stop_follow = await self.config_store.follow(self._on_config)
        await self.bus.watch_latest(self.bus.names.subject("inventory.>"), Decoder(NodeInventory), self._on_inventory)
        records = [rec for rec, _ in (await self.store.load_all()).values()]
        self.accounting = Accounting.build(self._book(), self.node_pool, records, self.ctx.clock.now())
        self._stale = False
        consumer = self.bus.consumer(
            stream=DECISIONS,
            durable="quota",
            filter_subjects=[self.bus.names.subject("decisions.state.>")],
            decoder=Decoder(JobStateChanged),
            handler=self.on_state_changed,
            batch_handler=self.on_state_changes,
            batch=256,
        )
        await consumer.start()

    async def bootstrap(self) -> None:
        path = self.ctx.settings.quota_file
        _, revision = await self.config_store.get()
        if revision or not path:
            return
        seed = load_yaml(path)
        validate(seed)
        await self.config_store.put(seed, 0)
        log.info("quota.bootstrapped", path=path, teams=len(seed.teams), pools=len(seed.pools))

    @property
    def records(self) -> dict[str, JobRecord]:
        return self.accounting.records

    def _on_config(self, config: QuotaConfig) -> None:
        self.config = config
        self._stale = True

    def _on_inventory(self, inv: NodeInventory) -> None:
        if self.node_pool.get(inv.node.name) != inv.node.pool:
            self.node_pool[inv.node.name] = inv.node.pool
            self._stale = True
        self.node_gpus[inv.node.name] = len(inv.node.gpus)

    def _book(self) -> QuotaBook:
        return QuotaBook(self.config, self.capacity())

    def capacity(self) -> dict[str, int]:
        cap: dict[str, int] = {}
        for node, pool in self.node_pool.items():
            cap[pool] = cap.get(pool, 0) + self.node_gpus.get(node, 0)
        return cap

    async def on_state_changed(self, event: JobStateChanged) -> None:
        self.accounting.apply(event.record, self.ctx.clock.now())

    async def on_state_changes(self, events: list[JobStateChanged]) -> None:
        """A fetched batch, applied in order and acked together (each change is applied as it alone would be)."""
        now = self.ctx.clock.now()
        for event in events:
            self.accounting.apply(event.record, now)

    async def publish(self) -> None:
        now = self.ctx.clock.now()
        book = self._book()
        if self._stale:
            self.accounting = Accounting.build(book, self.node_pool, self.records.values(), now)
            self._stale = False
        teams = self.accounting.teams(now, book)
        stale = self._published is None or now - self._published.computed_at >= REFRESH_S
        if not stale and self._published is not None and self._published.teams == teams:
            return
        state = QuotaState(teams=teams, computed_at=now, orgs=org_totals(book, teams))
        await self.bus.publish(self.bus.names.quota_state(), state)
        self._published = state

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.publish()
            except PublishError as exc:
                log.warning("quota.publish_failed", error=str(exc))
            await wait_event(stop, PUBLISH_INTERVAL_S)
        if self._stop_follow is not None:
            await self._stop_follow()


async def main(ctx: Context, stop: asyncio.Event) -> None:
    bus = await ctx.bus()
    quota = Quota(
        ctx,
        bus,
        await JobStore.open(bus),
        QuotaStore(await bus.key_value(QUOTA_BUCKET)),
    )
    try:
        try:
            await quota.start()
        except ConfigError as exc:
            log.error("quota.bad_quota_file", error=str(exc))
            raise
        await quota.run(stop)
    finally:
        await bus.close()
