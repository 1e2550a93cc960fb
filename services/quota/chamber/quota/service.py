"""The quota shell: own the quota configuration, follow every job, publish per-team quota state.

At start the configuration is seeded from `CHAMBER_QUOTA_FILE` into the quota KV bucket if none is stored yet;
afterwards the KV is the truth (admins change it through the gateway). Usage and spend come from the job records,
so a restart recomputes them exactly: at start from all records, then the writes followed in the jobs KV, taken in
before each publication, the newest of each job (`chamber.quota.core.accounting`). The service keeps only the
records of jobs that have not ended (an ended job's record settles into the sums), so a new configuration or a node
changing pool reads every record again, once; a node new to the inventory re-sums only the jobs not settled. Each
write is taken in once (`follow_entries` skips what a recreated consumer delivers again, and a write the records
read at start hold already is skipped too): a settled job taken in twice would be counted twice.

The records are followed, not the `decisions.state` announcements: the sums are a function of the current records,
so the transitions between two writes of a record add nothing, and following needs no acks (three a job, which
cost the NATS server more than the follow itself).
"""

import asyncio
from collections.abc import Callable
from typing import Any

import nats.errors
import nats.js.errors

from chamber.common.bus import Bus, BusError, PublishError
from chamber.common.codec import Decoder
from chamber.common.contracts import JobRecord, NodeInventory, QuotaConfig, QuotaState
from chamber.common.jobstore import JobStore
from chamber.common.log import get_logger
from chamber.common.quota import ConfigError, QuotaBook, validate
from chamber.common.quotastore import QuotaStore, load_yaml
from chamber.common.runtime import Context, wait_event
from chamber.common.subjects import DECISIONS
from chamber.quota.core.accounting import Accounting
from chamber.quota.core.report import org_totals

log = get_logger(__name__)

PUBLISH_INTERVAL_S = 1.0
REFRESH_S = 10.0
OLD_CONSUMER = "quota"


class Quota:
    def __init__(self, ctx: Context, bus: Bus, store: JobStore, config_store: QuotaStore) -> None:
        self.ctx = ctx
        self.bus = bus
        self.store = store
        self.config_store = config_store
        self.config = QuotaConfig()
        self.accounting = Accounting(QuotaBook(self.config), {}, ctx.clock.now())
        self._reload = False
        """The configuration changed, or a node moved to another pool (or appeared where a settled job had run),
        since the accounting was built: every record is read again."""
        self._new_nodes = False
        """Nodes new to the inventory since the accounting was built (see `Accounting.with_nodes`)."""
        self.node_pool: dict[str, str] = {}
        self.node_gpus: dict[str, int] = {}
        self._published: QuotaState | None = None
        self._stop_follow: Callable[[], Any] | None = None
        self._stop_records: Callable[[], Any] | None = None
        self._arrived: dict[str, JobRecord] = {}
        """The records written since the accounting last took them in, the newest of each job: taken in together
        before the sums are read (`publish`), so a job placed, started and perhaps ended within that second is
        summed once, not once per write (the sums are a function of the current records)."""
        self._read_up_to = 0
        """The stream sequence the accounting was built up to (`load`): a write at or before it is in it already (the
        new follow starts after it; this also drops a late delivery of the follow stopped for the reload)."""

    async def start(self) -> None:
        await self.bootstrap()
        self.config, _ = await self.config_store.get()  # (so the follow's first delivery, the same, reads nothing)
        self._stop_follow = await self.config_store.follow(self._on_config)
        await self.bus.watch_latest(self.bus.names.subject("inventory.>"), Decoder(NodeInventory), self._on_inventory)
        await self.load()
        await self._drop_old_consumer()

    async def load(self) -> None:
        """Sum every record (those of ended jobs settle into the sums), then follow the writes after them."""
        if self._stop_records is not None:
            await self._stop_records()
            self._stop_records = None
        stored, last = await self.store.snapshot()
        self._reload = self._new_nodes = False  # (what changed until now is in the accounting built next)
        self._arrived.clear()
        self._read_up_to = last
        records = (rec for rec, _ in stored.values())
        self.accounting = Accounting.build(self._book(), self.node_pool, records, self.ctx.clock.now())
        del stored
        try:
            self._stop_records = await self.store.follow_entries(self._on_entry, after=last)
        except BusError:
            self._reload = True  # not following: read everything again at the next turn
            raise

    async def _drop_old_consumer(self) -> None:
        """Versions that consumed `decisions.state` left a durable consumer on DECISIONS, which nobody acks now."""
        try:
            await self.bus.js.delete_consumer(self.bus.names.stream(DECISIONS), OLD_CONSUMER)
        except nats.js.errors.NotFoundError:
            return
        except nats.errors.Error as exc:  # (no permission, a leader election): it is only left over
            log.warning("quota.old_consumer_left", consumer=OLD_CONSUMER, error=str(exc))
            return
        log.info("quota.old_consumer_deleted", consumer=OLD_CONSUMER)

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
        """The records of the jobs that have not ended."""
        return self.accounting.records

    def _on_config(self, config: QuotaConfig) -> None:
        if config != self.config:  # (the same one again, as after a NATS restart, changes nothing)
            self.config = config
            self._reload = True

    def _on_inventory(self, inv: NodeInventory) -> None:
        name, pool = inv.node.name, inv.node.pool
        known = self.node_pool.get(name)
        if known != pool:
            self.node_pool[name] = pool
            if known is None and name not in self.accounting.settled_on_unknown:
                self._new_nodes = True
            else:
                self._reload = True
        self.node_gpus[name] = len(inv.node.gpus)

    def _book(self) -> QuotaBook:
        return QuotaBook(self.config, self.capacity())

    def capacity(self) -> dict[str, int]:
        cap: dict[str, int] = {}
        for node, pool in self.node_pool.items():
            cap[pool] = cap.get(pool, 0) + self.node_gpus.get(node, 0)
        return cap

    def _on_entry(self, job_id: str, record: JobRecord | None, sequence: int) -> None:
        if record is None or sequence <= self._read_up_to:  # (None: a key removed; its spend stays summed)
            return
        known = self._arrived.get(record.id)
        if known is None or known.version < record.version:
            self._arrived[record.id] = record

    def take_arrived(self) -> None:
        """Take the records written since the last time into the accounting."""
        arrived, self._arrived = self._arrived, {}
        now = self.ctx.clock.now()
        for record in arrived.values():
            self.accounting.apply(record, now)

    async def publish(self) -> None:
        if self._reload:
            await self.load()
        elif self._new_nodes:
            self._new_nodes = False
            self.accounting.with_nodes(self.node_pool)
        self.take_arrived()
        now = self.ctx.clock.now()
        book = self._book()
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
            except BusError as exc:  # reading the records again failed: tried again at the next turn
                log.warning("quota.reload_failed", error=str(exc))
            await wait_event(stop, PUBLISH_INTERVAL_S)
        for stop_following in (self._stop_follow, self._stop_records):
            if stop_following is not None:
                await stop_following()


async def main(ctx: Context, stop: asyncio.Event) -> None:
    bus = await ctx.bus()
    quota = Quota(
        ctx,
        bus,
        await JobStore.open(bus),
        await QuotaStore.open(bus),
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
