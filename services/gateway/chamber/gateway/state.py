"""What the gateway knows and how it reaches the rest of Chamber: the bus, the ledger, the job records, inventory,
quota configuration and state, fleet metrics, tokens, the audit trail and the live fan-out.

Everything a hot read needs is followed into memory (jobs KV, inventory, quota, metrics, tokens). The ledger
(GPU allocation and cordons) is re-read from Redis only after something that moves it was seen (a job record
changed, a health verdict, new inventory) or after a second, and concurrent readers share one re-read: a read
with nothing new does no I/O at all. Claims of attempts the records seen here have given back are left out of
it (the scheduler releases an attempt's GPUs just after it writes the job's end, stop or requeue), so the fleet
agrees with the jobs it shows.
"""

import asyncio
import contextlib
import dataclasses
import sys
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Any

import msgspec
import nats.errors
import redis.exceptions
from nats.aio.msg import Msg
from nats.js.api import KeyValueConfig, StorageType
from nats.js.kv import KeyValue

from chamber.common.bus import Bus
from chamber.common.bus.errors import BusError
from chamber.common.codec import DecodeError, Decoder
from chamber.common.contracts import (
    TERMINAL_STATES,
    FleetSnapshot,
    GpuHealthVerdict,
    JobRecord,
    JobSpec,
    JobSubmitted,
    Node,
    NodeInventory,
    NodeTelemetry,
    NodeTelemetryColumns,
    QuotaConfig,
    QuotaState,
    RollupPoint,
    TeamUsage,
    as_telemetry,
)
from chamber.common.feasibility import Infeasible, never_fits
from chamber.common.jobstore import JobStore
from chamber.common.ledger import Ledger, LedgerSnapshot
from chamber.common.ledger.errors import LedgerUnavailable
from chamber.common.log import get_logger
from chamber.common.quotastore import QuotaStore
from chamber.common.runtime import Context
from chamber.common.subjects import (
    HEALTH,
    IDEMPOTENCY_BUCKET,
    IDEMPOTENCY_TTL_S,
    JOBS,
    METRICS,
    StreamSpec,
)
from chamber.gateway.access_log import AccessLog
from chamber.gateway.audit import AuditLog
from chamber.gateway.cache import ResponseCache
from chamber.gateway.core.views import FleetView, JobView, fleet_view, job_view, node_views, submitted_view
from chamber.gateway.errors import Unavailable
from chamber.gateway.intake import IntakeGate
from chamber.gateway.jobs_index import JobsIndex
from chamber.gateway.live import Broadcaster
from chamber.gateway.tokens import TokenStore

log = get_logger(__name__)

_submitted = Decoder(JobSubmitted)
_telemetry = Decoder(NodeTelemetryColumns | NodeTelemetry)


class _Kind(msgspec.Struct):
    kind: str = ""


_kind = msgspec.json.Decoder(_Kind)
_BATCHES = ("NodeTelemetryColumns", "NodeTelemetry")
FLEET_TICK_S = 1.0
FEASIBILITY_ENTRIES = 1024
"""Job shapes whose feasibility is remembered (forgotten all at once beyond this, or when the fleet changes)."""
LEDGER_TTL_S = 1.0
"""The ledger is re-read at least this often even when no change was seen (a flush, a rebuild)."""


def _gave_back(record: JobRecord, attempt: int) -> bool:
    """Has the job, as `record` says, given back the claim of `attempt`: ended, on a later attempt, or this very
    attempt stopped or requeued (no placement)? A claim just made is for the attempt after the record's (the
    scheduler claims before it writes the placement), so a record that lags behind never hides it."""
    return (
        record.state in TERMINAL_STATES
        or record.attempt > attempt
        or (record.attempt == attempt and record.placement is None)
    )


class GatewayState:
    """Owns the gateway's connections; opened in the app's start-up hook, on the loop that serves requests."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.settings = ctx.settings
        self.clock = ctx.clock
        self._bus: Bus | None = None
        self._ledger: Ledger | None = None
        self.store: JobStore | None = None
        self.jobs = JobsIndex(ctx.settings.gateway_finished_jobs)
        self.intake = IntakeGate(ctx.settings.intake_limit, known=lambda job_id: job_id in self.jobs.records)
        self.nodes: dict[str, Node] = {}
        self.nodes_version = 0
        self.quota_state: QuotaState | None = None
        self.quota_config: QuotaConfig | None = None
        self.quota_config_version = 0
        self._feasibility: dict[Hashable, list[Infeasible]] = {}
        self._feasibility_key: tuple[int, int] = (-1, -1)
        self.metrics: FleetSnapshot | None = None
        self.telemetry: dict[str, bytes] = {}
        """node -> its latest NodeTelemetry, undecoded (decoded only when the heatmap is asked for)."""
        self._quota_store: QuotaStore | None = None
        self._tokens: TokenStore | None = None
        self._audit: AuditLog | None = None
        self._idempotency: KeyValue | None = None
        self.live = Broadcaster()
        self.responses = ResponseCache()
        self.access_log = AccessLog(ctx.settings.log_format)
        self.announced_token: str | None = None
        self._snap: LedgerSnapshot | None = None
        self._snap_gen = -1
        self._snap_at = 0.0
        self._ledger_gen = 0
        self._snap_check: asyncio.Future[LedgerSnapshot] | None = None
        self._check_gen = -1
        self.ledger_epoch = 0
        """Counts the snapshots read: part of the key of every cached answer computed from one."""
        self._stops: list[Callable[[], Awaitable[None]]] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._dirty = True

    # -- connections -------------------------------------------------------------------------------------------

    @property
    def bus(self) -> Bus:
        assert self._bus is not None, "gateway not started"
        return self._bus

    @property
    def ledger(self) -> Ledger:
        assert self._ledger is not None, "gateway not started"
        return self._ledger

    @property
    def quota_store(self) -> QuotaStore:
        assert self._quota_store is not None, "gateway not started"
        return self._quota_store

    @property
    def tokens(self) -> TokenStore:
        assert self._tokens is not None, "gateway not started"
        return self._tokens

    @property
    def audit(self) -> AuditLog:
        assert self._audit is not None, "gateway not started"
        return self._audit

    @property
    def idempotency(self) -> KeyValue:
        assert self._idempotency is not None, "gateway not started"
        return self._idempotency

    @property
    def records(self) -> dict[str, JobRecord]:
        return self.jobs.records

    def require_bus(self) -> None:
        """Fail fast (503, Retry-After) instead of letting a request wait out NATS's reconnect timeouts."""
        if self._bus is None or not self._bus.nc.is_connected:
            raise Unavailable("NATS is not reachable; the gateway cannot read or write jobs right now")

    async def start(self) -> None:
        self._bus = await self.ctx.bus()
        self._ledger = self.ctx.ledger()
        self.store = await JobStore.open(self.bus)
        self._stops.append(await self.store.follow(self._on_record))
        names = self.bus.names
        await self.bus.watch_latest(names.subject("inventory.>"), Decoder(NodeInventory), self._on_inventory)
        await self.bus.watch_latest(names.quota_state(), Decoder(QuotaState), self._on_quota)
        await self.bus.watch_latest(names.subject("metrics.fleet"), Decoder(FleetSnapshot), self._on_metrics)
        self._quota_store = await QuotaStore.open(self.bus)
        self._stops.append(await self.quota_store.follow(self._on_quota_config))
        self._tokens = await TokenStore.open(self.bus, self.clock)
        await self.tokens.start()
        self._stops.append(self.tokens.stop)
        self._audit = AuditLog(self.bus)
        self._idempotency = await self._ttl_bucket(IDEMPOTENCY_BUCKET, IDEMPOTENCY_TTL_S)
        await self.bus.nc.subscribe(names.subject("health.verdicts.>"), cb=self._on_verdict)
        await self.bus.nc.subscribe(names.subject("telemetry.>"), cb=self._on_telemetry)
        self._tasks.append(asyncio.create_task(self._fleet_ticker(), name="gateway-fleet-ticker"))
        await self._bootstrap_admin()

    async def stop(self) -> None:
        self.access_log.flush()
        self.live.close()
        for task in self._tasks:
            task.cancel()
        for stop in self._stops:
            with contextlib.suppress(Exception):
                await stop()
        if self._bus is not None:
            await self._bus.close()
        if self._ledger is not None:
            await self._ledger.close()

    async def _ttl_bucket(self, bucket: str, ttl_s: float) -> KeyValue:
        name = self.bus.names.bucket(bucket)
        try:
            kv = await self.bus.js.key_value(name)
            await self.bus.scale_bucket(name)
            return kv
        except nats.errors.Error:
            pass
        try:
            return await self.bus.js.create_key_value(
                KeyValueConfig(bucket=name, history=1, ttl=ttl_s, storage=StorageType.FILE, replicas=self.bus.replicas)
            )
        except nats.errors.Error:
            return await self.bus.js.key_value(name)

    async def _bootstrap_admin(self) -> None:
        s = self.settings
        token = await self.tokens.bootstrap(s.admin_token, s.admin_token_file, self.clock.now())
        self.announced_token = token
        if token is None:
            if s.admin_token_file and not s.admin_token:
                print(f"chamber: development admin token in {s.admin_token_file}", file=sys.stderr, flush=True)
            return
        lines = ["an admin API token was made (shown once; keep it):", f"  {token}"]
        if s.admin_token_file:
            lines = [f"a DEVELOPMENT admin token was made and written to {s.admin_token_file}:", f"  {token}"]
        lines.append("use it as 'Authorization: Bearer <token>', or: chamber login --token <token>")
        print("\n".join(f"chamber: {line}" for line in lines), file=sys.stderr, flush=True)

    # -- followed state ----------------------------------------------------------------------------------------

    def _on_record(self, record: JobRecord, *, read: bool = False) -> None:
        """A record from the follow, or `read` by id from the KV (`JobsIndex.refresh`)."""
        self.intake.taken(record.id)
        if self.jobs.refresh(record) if read else self.jobs.upsert(record):
            self._dirty = True
            self._ledger_gen += 1
            if len(self.live):
                self.live.publish("job", msgspec.json.encode(job_view(record)), team=record.spec.team)

    def _on_inventory(self, inv: NodeInventory) -> None:
        if self.nodes.get(inv.node.name) != inv.node:
            self.nodes[inv.node.name] = inv.node
            self.nodes_version += 1
            self._dirty = True
            self._ledger_gen += 1

    def _on_quota(self, state: QuotaState) -> None:
        self.quota_state = state

    def _on_quota_config(self, config: QuotaConfig) -> None:
        self.quota_config = config
        self.quota_config_version += 1

    def never_fits(self, spec: JobSpec) -> list[Infeasible]:
        """`chamber.common.feasibility.never_fits` against the current inventory and quota configuration,
        remembered per job shape until either changes (it walks every node: most of a submit's CPU otherwise)."""
        version = (self.nodes_version, self.quota_config_version)
        if version != self._feasibility_key or len(self._feasibility) >= FEASIBILITY_ENTRIES:
            self._feasibility = {}
            self._feasibility_key = version
        topology = None if spec.topology is None else msgspec.json.encode(spec.topology)
        shape = (spec.team, spec.priority, spec.pool, spec.gpu_model, spec.gpus_per_replica, spec.replicas, topology)
        found = self._feasibility.get(shape)
        if found is None:
            found = self._feasibility[shape] = never_fits(spec, list(self.nodes.values()), self.quota_config)
        return found

    def _on_metrics(self, snapshot: FleetSnapshot) -> None:
        self.metrics = snapshot
        self._dirty = True

    async def _on_verdict(self, msg: Msg) -> None:
        self._dirty = True
        self._ledger_gen += 1
        if len(self.live):
            self.live.publish("health", msg.data)

    async def _on_telemetry(self, msg: Msg) -> None:
        try:
            if _kind.decode(msg.data).kind in _BATCHES:
                self.telemetry[msg.subject.rsplit(".", 1)[-1]] = msg.data
        except (msgspec.DecodeError, msgspec.ValidationError):
            return

    def mark_dirty(self) -> None:
        """Something the fleet totals depend on may have changed: live subscribers get them at the next tick."""
        self._dirty = True

    async def _fleet_ticker(self) -> None:
        """Push the fleet totals to live subscribers, at most once a second and only when something changed."""
        while True:
            await asyncio.sleep(FLEET_TICK_S)
            if not len(self.live) or not self._dirty:
                continue
            self._dirty = False
            try:
                view = await self.fleet()
            except Unavailable:
                continue
            self.live.publish("fleet", msgspec.json.encode(view))

    # -- reads -------------------------------------------------------------------------------------------------

    def quota_usage(self, team: str) -> TeamUsage | None:
        return None if self.quota_state is None else self.quota_state.teams.get(team)

    def quota_teams(self) -> list[str]:
        return [] if self.quota_state is None else list(self.quota_state.teams)

    def pool_capacity(self) -> dict[str, int]:
        capacity: dict[str, int] = {}
        for node in self.nodes.values():
            capacity[node.pool] = capacity.get(node.pool, 0) + len(node.gpus)
        return capacity

    def largest_node_gpus(self) -> int:
        return max((len(n.gpus) for n in self.nodes.values()), default=0)

    def latest_telemetry(self) -> dict[str, NodeTelemetry]:
        out: dict[str, NodeTelemetry] = {}
        for node, raw in list(self.telemetry.items()):
            with contextlib.suppress(DecodeError):
                batch = as_telemetry(_telemetry.decode(raw))
                assert isinstance(batch, NodeTelemetry)
                out[node] = batch
        return out

    def ledger_changed(self) -> None:
        """Something that moves the ledger happened (an operator order was sent): the next read re-reads it."""
        self._ledger_gen += 1

    async def ledger_snapshot(self) -> LedgerSnapshot:
        """The ledger as of the latest change seen (see the module docstring)."""
        want = self._ledger_gen
        snap = self._snap
        if snap is not None and self._snap_gen >= want and time.monotonic() - self._snap_at < LEDGER_TTL_S:
            return snap
        check = self._snap_check
        if check is None or self._check_gen < want:
            check = asyncio.ensure_future(self._read_ledger(want))
            self._snap_check, self._check_gen = check, want
            check.add_done_callback(self._check_done)
        return await asyncio.shield(check)

    def _check_done(self, done: "asyncio.Future[LedgerSnapshot]") -> None:
        if self._snap_check is done:
            self._snap_check = None

    async def _read_ledger(self, generation: int) -> LedgerSnapshot:
        started = time.monotonic()
        try:
            snap = await self.ledger.snapshot()
        except (redis.exceptions.RedisError, LedgerUnavailable, OSError) as exc:
            raise Unavailable(f"Redis (the GPU ledger) is not reachable: {exc}") from exc
        snap = self._without_given_back(snap)
        if generation >= self._snap_gen:
            self._snap, self._snap_gen, self._snap_at = snap, generation, started
            self.ledger_epoch += 1
        return snap

    def _without_given_back(self, snap: LedgerSnapshot) -> LedgerSnapshot:
        """The ledger less the claims of attempts that the records seen here have given back. The scheduler writes
        a job's end, stop or requeue before it releases the attempt's GPUs (a crash in between must never free GPUs
        under a record that still holds them), so a client that has just read it could otherwise still see them
        held."""
        given_back = {
            job_id for job_id, claim in snap.claims.items()
            if (r := self.records.get(job_id)) is not None and _gave_back(r, claim.attempt)
        }  # fmt: skip
        if not given_back:
            return snap
        owners = {slot: owner for slot, owner in snap.owners.items() if owner.rsplit("/", 1)[0] not in given_back}
        claims = {job_id: claim for job_id, claim in snap.claims.items() if job_id not in given_back}
        return dataclasses.replace(snap, owners=owners, claims=claims)

    async def fleet(self, snap: LedgerSnapshot | None = None) -> FleetView:
        snap = snap or await self.ledger_snapshot()
        return fleet_view(node_views(self.nodes.values(), snap.owners, snap.cordoned), self.records.values(),
                          self.metrics)  # fmt: skip

    async def job(self, job_id: str) -> JobView | None:
        """The freshest view of a job: its record, else its accepted submission, else None."""
        record = await self.job_record(job_id)
        if record is not None:
            return job_view(record)
        submitted = await self.submitted(job_id)
        return None if submitted is None else submitted_view(submitted.job_id, submitted.spec, submitted.submitted_at)

    async def job_history(self, job_id: str) -> list[JobRecord]:
        """The job's stored versions, oldest first: the log of its changes."""
        assert self.store is not None
        self.require_bus()
        try:
            return await self.store.history(job_id)
        except BusError as exc:
            raise Unavailable(str(exc)) from exc

    async def job_record(self, job_id: str) -> JobRecord | None:
        assert self.store is not None
        self.require_bus()
        try:
            stored = await self.store.get(job_id)
        except BusError as exc:
            raise Unavailable(str(exc)) from exc
        if stored is None:
            return None
        self._on_record(stored[0], read=True)
        return stored[0]

    async def submitted(self, job_id: str) -> JobSubmitted | None:
        """The job's submission as stored on the JOBS stream (before the scheduler made a record of it)."""
        self.require_bus()
        try:
            data = await self.bus.last_message(JOBS, self.bus.names.job_submit(job_id))
        except (nats.errors.Error, TimeoutError) as exc:
            raise Unavailable(f"cannot read the JOBS stream: {exc}") from exc
        if data is None:
            return None
        try:
            event: JobSubmitted = _submitted.decode(data)
        except DecodeError:
            return None
        return event

    async def history(self, resolution: str, since: float) -> list[RollupPoint]:
        subject = self.bus.names.subject(f"metrics.rollup.{resolution}")
        points: list[RollupPoint] = await self.read_stream(METRICS, subject, since, Decoder(RollupPoint))
        return [p for p in points if p.start >= since]

    async def health_history(self, node: str, since: float) -> list[GpuHealthVerdict]:
        subject = self.bus.names.subject(f"health.verdicts.{node}.>")
        verdicts: list[GpuHealthVerdict] = await self.read_stream(HEALTH, subject, since, Decoder(GpuHealthVerdict))
        return verdicts

    async def read_stream(self, stream: StreamSpec, subject: str, since: float, decoder: Decoder) -> list[Any]:
        """Every message on `subject` stored at or after `since`, decoded (garbage skipped); no waiting when there
        is none (`chamber.common.bus.reading`)."""
        self.require_bus()
        try:
            return await self.bus.read_since(stream, subject, since, decoder)
        except BusError as exc:
            raise Unavailable(f"cannot read {subject}: {exc}") from exc

    async def problems(self) -> list[str]:
        problems = []
        if self._bus is None or not self.bus.nc.is_connected:
            problems.append("NATS disconnected")
        try:
            await self.ledger.redis.ping()
        except Exception as exc:  # any failure means not ready
            problems.append(f"Redis: {exc}")
        return problems
