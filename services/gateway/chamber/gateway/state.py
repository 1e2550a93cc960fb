"""What the gateway reads from: the jobs KV (followed into memory), node inventory, and the ledger."""

from collections.abc import Awaitable, Callable

from chamber.common.bus import Bus
from chamber.common.codec import DecodeError, Decoder
from chamber.common.contracts import (
    FleetSnapshot,
    GpuHealthVerdict,
    JobRecord,
    JobSubmitted,
    Node,
    NodeInventory,
    QuotaState,
    RollupPoint,
    TeamUsage,
)
from chamber.common.jobstore import JobStore
from chamber.common.ledger import Ledger
from chamber.common.quotastore import QuotaStore
from chamber.common.runtime import Context
from chamber.common.subjects import HEALTH, JOBS, METRICS, QUOTA_BUCKET
from chamber.gateway.core.views import JobView, job_view, submitted_view

_submitted = Decoder(JobSubmitted)


class GatewayState:
    """Owns the gateway's connections; opened in the app's start-up hook, on the loop that serves requests."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.clock = ctx.clock
        self._bus: Bus | None = None
        self._ledger: Ledger | None = None
        self.store: JobStore | None = None
        self.records: dict[str, JobRecord] = {}
        self.nodes: dict[str, Node] = {}
        self.quota_state: QuotaState | None = None
        self.metrics: FleetSnapshot | None = None
        self._quota_store: QuotaStore | None = None
        self._stop_follow: Callable[[], Awaitable[None]] | None = None

    @property
    def bus(self) -> Bus:
        assert self._bus is not None, "gateway not started"
        return self._bus

    @property
    def quota_store(self) -> QuotaStore:
        assert self._quota_store is not None, "gateway not started"
        return self._quota_store

    def _on_metrics(self, snapshot: FleetSnapshot) -> None:
        self.metrics = snapshot

    async def history(self, resolution: str, since: float) -> list[RollupPoint]:
        subject = self.bus.names.subject(f"metrics.rollup.{resolution}")
        points: list[RollupPoint] = await self.bus.read_since(METRICS, subject, since, Decoder(RollupPoint))
        return [p for p in points if p.start >= since]

    async def health_history(self, node: str, since: float) -> list[GpuHealthVerdict]:
        subject = self.bus.names.subject(f"health.verdicts.{node}.>")
        verdicts: list[GpuHealthVerdict] = await self.bus.read_since(HEALTH, subject, since, Decoder(GpuHealthVerdict))
        return verdicts

    def _on_quota(self, state: QuotaState) -> None:
        self.quota_state = state

    def quota_usage(self, team: str) -> TeamUsage | None:
        return None if self.quota_state is None else self.quota_state.teams.get(team)

    def quota_teams(self) -> list[str]:
        return [] if self.quota_state is None else list(self.quota_state.teams)

    def pool_capacity(self) -> dict[str, int]:
        capacity: dict[str, int] = {}
        for node in self.nodes.values():
            capacity[node.pool] = capacity.get(node.pool, 0) + len(node.gpus)
        return capacity

    @property
    def ledger(self) -> Ledger:
        assert self._ledger is not None, "gateway not started"
        return self._ledger

    async def start(self) -> None:
        self._bus = await self.ctx.bus()
        self._ledger = self.ctx.ledger()
        self.store = await JobStore.open(self.bus)
        self._stop_follow = await self.store.follow(self._on_record)
        await self.bus.watch_latest(self.bus.names.subject("inventory.>"), Decoder(NodeInventory), self._on_inventory)
        await self.bus.watch_latest(self.bus.names.quota_state(), Decoder(QuotaState), self._on_quota)
        await self.bus.watch_latest(self.bus.names.subject("metrics.fleet"), Decoder(FleetSnapshot), self._on_metrics)
        self._quota_store = QuotaStore(await self.bus.key_value(QUOTA_BUCKET))

    async def stop(self) -> None:
        if self._stop_follow is not None:
            await self._stop_follow()
        if self._bus is not None:
            await self._bus.close()
        if self._ledger is not None:
            await self._ledger.close()

    def _on_record(self, record: JobRecord) -> None:
        known = self.records.get(record.id)
        if known is None or known.version <= record.version:
            self.records[record.id] = record

    def _on_inventory(self, inv: NodeInventory) -> None:
        self.nodes[inv.node.name] = inv.node

    def largest_node_gpus(self) -> int:
        return max((len(n.gpus) for n in self.nodes.values()), default=0)

    async def job(self, job_id: str) -> JobView | None:
        """The freshest view of a job: its record, else its accepted submission, else None."""
        assert self.store is not None
        stored = await self.store.get(job_id)
        if stored is not None:
            self._on_record(stored[0])
            return job_view(stored[0])
        data = await self.bus.last_message(JOBS, self.bus.names.job_submit(job_id))
        if data is None:
            return None
        try:
            event: JobSubmitted = _submitted.decode(data)
        except DecodeError:
            return None
        return submitted_view(event.job_id, event.spec, event.submitted_at)

    async def problems(self) -> list[str]:
        problems = []
        if not self.bus.nc.is_connected:
            problems.append("NATS disconnected")
        try:
            await self.ledger.redis.ping()
        except Exception as exc:  # any failure means not ready
            problems.append(f"Redis: {exc}")
        return problems
