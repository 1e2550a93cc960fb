"""Fleet metrics, computed continuously from the latest sample of every GPU (definitions: docs/metrics.md).

Built for 100,000 GPUs reporting every second, with a snapshot four times a second:
- `ingest_many` takes node batches by the thousand: one lookup per node, per GPU its slot and raw fields gathered,
  then activity (0..1) computed by numpy and written with the sample times into flat columns (`slots.SlotTable`)
  in one scatter; each batch is kept as it came for `/metrics`;
- inventory, job placements (who holds which GPU), the queue and cordons are applied as they change, not joined
  anew at every snapshot;
- `snapshot` reads the columns with numpy: a handful of vector operations over all GPUs, milliseconds at 100,000.
  It integrates the time since the previous snapshot into allocated-but-idle GPU-hours per team and per job.

Pure: the time comes in as an argument.
"""

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from chamber.collector.core.slots import NONE, Interned, SlotTable, flags, floats, ints
from chamber.common.contracts import (
    TERMINAL_STATES,
    FleetSnapshot,
    JobRecord,
    JobState,
    NodeActivityView,
    NodeColumnsActivityView,
    NodeTelemetry,
)
from chamber.common.contracts.telemetry import MAX_GPUS_PER_NODE

IDLE_POWER_SHARE = 0.10
"""A GPU drawing under 10% of its power limit counts as idle, whatever its utilization counter says."""
STALE_INTERVALS = 3
JOBS_REPORTED = 100
"""`allocated_idle_gpu_hours_by_job` lists at most this many jobs (those holding GPUs now, the idlest first)."""
WAITING = (JobState.PENDING, JobState.PREEMPTED)
Batch = NodeColumnsActivityView | NodeActivityView | NodeTelemetry
"""A node's batch as the aggregator decodes it (columns, or rows from an older publisher), or in full."""
_IOTA = list(range(MAX_GPUS_PER_NODE))
_NANS = [float("nan")] * MAX_GPUS_PER_NODE


class ActivityFields(Protocol):
    """What activity is computed from: a `GpuSample`, or the lean `GpuActivityView` the aggregator decodes."""

    @property
    def gpu_util(self) -> float | None: ...
    @property
    def sm_activity(self) -> float | None: ...
    @property
    def power_w(self) -> float | None: ...
    @property
    def power_limit_w(self) -> float | None: ...
    @property
    def usage(self) -> float | None: ...


def activity(sample: ActivityFields) -> float:
    """0..1: how busy the GPU is (its GPM usage when the node agent offers it, which already counts idle power as
    0; else SM activity, else utilization), 0 when it draws idle power; NaN when the sample tells none of these
    (a source without utilization counters: such a GPU is not taken for idle, see `FleetMetrics.snapshot`)."""
    if sample.usage is not None:
        return max(0.0, min(1.0, sample.usage / 100))
    power, limit = sample.power_w, sample.power_limit_w
    if power is not None and limit and power < IDLE_POWER_SHARE * limit:
        return 0.0
    if sample.sm_activity is not None:
        return max(0.0, min(1.0, sample.sm_activity))
    if sample.gpu_util is not None:
        return max(0.0, min(1.0, sample.gpu_util / 100))
    return math.nan


Column = npt.NDArray[np.float64]


def column(values: list[float | None]) -> Column:
    """A field of many samples as numbers, NaN where a sample has none."""
    return np.array(values, dtype=np.float64)


def activities(usage: Column, power: Column, limit: Column, sm: Column, util: Column) -> Column:
    """`activity` of many samples at once, from their fields as columns (NaN where a sample has none)."""
    with np.errstate(invalid="ignore"):
        act = np.clip(util / 100, 0.0, 1.0)  # (NaN stays NaN: nothing known)
        act = np.where(np.isnan(sm), act, np.clip(sm, 0.0, 1.0))
        act = np.where((limit != 0) & (power < IDLE_POWER_SHARE * limit), 0.0, act)
        return np.where(np.isnan(usage), act, np.clip(usage / 100, 0.0, 1.0))


@dataclass(frozen=True, slots=True)
class PoolPrice:
    pool: str
    cloud: str
    cost_per_gpu_hour: float


def holds_gpus(record: JobRecord) -> bool:
    """A placed job holds its GPUs (claimed in the ledger) from placement until it stops or ends."""
    return record.placement is not None and record.state not in TERMINAL_STATES


class FleetMetrics:
    def __init__(self) -> None:
        self.slots = SlotTable()
        self.pools = Interned()
        self.prices: list[PoolPrice] = []
        self.clouds = Interned()
        self.teams = Interned()
        self.jobs = Interned()
        self.job_slots: dict[str, list[int]] = {}
        self.job_idle_s = np.zeros(0)
        """Per job id (jobs holding GPUs now): allocated-but-idle GPU-seconds."""
        self.idle_seconds_by_team: dict[str, float] = {}
        self.waiting: dict[str, tuple[str, str]] = {}
        """job -> (team, priority) of jobs waiting to be placed."""
        self.queue_by_team: dict[str, int] = {}
        self.queue_by_priority: dict[str, int] = {}
        self.latest: list[NodeTelemetry | bytes | None] = []
        """Per node id: its latest batch, as it came (bytes are decoded only when `/metrics` is scraped)."""
        self.latest_at: list[float] = []
        """Per node id: when its latest batch was sampled."""
        self.last_xid: dict[tuple[str, int], int] = {}
        """(node, GPU index) -> the last XID its node agent reported as an event (NVML's event set: not in samples),
        exported as `DCGM_FI_DEV_XID_ERRORS` as dcgm-exporter does (the last XID, kept)."""
        self.inventory_slots: dict[str, list[int]] = {}
        self.cordoned: list[int] = []
        self.reported_at: list[float] = []
        self.reported_gpus: list[int] = []
        """Sample time and GPUs of every batch since the last `take_reported` (the sample-to-metric lag); two flat
        lists of numbers, not a tuple per batch: 12,500 objects a second the garbage collector would scan."""
        self.last_at: float | None = None
        self.samples = 0

    # ---- telemetry (every batch) --------------------------------------------------------------------------------

    def ingest(self, batch: Batch, raw: bytes | None = None) -> None:
        """Take a node's batch; `raw`: the bytes it was decoded from (kept for `/metrics` instead of the batch)."""
        self.ingest_many([(batch, raw)])

    def ingest_many(self, batches: Iterable[tuple[Batch, bytes | None]]) -> None:
        """Take many node batches (each with the bytes it was decoded from, or None) at once, in arrival order (a
        GPU's later sample wins). Per batch: one lookup for the node and its GPUs' slots, its five activity columns
        appended to flat lists (per GPU only for the row form); then activity is computed by numpy and written with
        the sample times into the columns at once.

        `batches` may be a generator that decodes as it goes: each batch is then dropped as soon as it is read, so
        the garbage collector never sees thousands of decoded batches alive (that doubled the cost per batch)."""
        table = self.slots
        ids, node_slots = table.nodes.ids, table.node_slots
        interval, latest = table.cols.node_interval, self.latest
        where: list[int] = []
        usage: list[float | None] = []
        power: list[float | None] = []
        limit: list[float | None] = []
        sm: list[float | None] = []
        util: list[float | None] = []
        ats: list[float] = []
        counts: list[int] = []
        for batch, raw in batches:
            node = batch.node
            nid = ids.get(node)
            if nid is None:
                nid = table.node_id(node)
            slots = node_slots[nid]
            if isinstance(batch, NodeColumnsActivityView):
                index = batch.index
                n = len(index)
                got = slots[:n]
                if len(got) != n or index != _IOTA[:n] or NONE in got:
                    got = [table.slot(node, i) for i in index]
                where += got
                nans = _NANS[:n]  # a column absent on every GPU (NaN converts faster than None)
                usage += batch.usage or nans
                power += batch.power_w or nans
                limit += batch.power_limit_w or nans
                sm += batch.sm_activity or nans
                util += batch.gpu_util or nans
            else:
                n = 0
                known = len(slots)
                for s in batch.gpus:
                    i = s.index
                    slot = slots[i] if 0 <= i < known else NONE
                    if slot == NONE:
                        if not 0 <= i < MAX_GPUS_PER_NODE:
                            continue
                        slot = table.slot(node, i)
                        known = len(slots)
                    where.append(slot)
                    usage.append(s.usage)
                    power.append(s.power_w)
                    limit.append(s.power_limit_w)
                    sm.append(s.sm_activity)
                    util.append(s.gpu_util)
                    n += 1
            at = batch.sampled_at
            ats.append(at)
            counts.append(n)
            interval[nid] = batch.interval_s
            if nid >= len(latest):  # (times first: a scrape, in the HTTP server's thread, reads both)
                self.latest_at.extend([0.0] * (nid + 1 - len(self.latest_at)))
                latest.extend([None] * (nid + 1 - len(latest)))
            self.latest_at[nid] = at
            latest[nid] = raw if raw is not None else batch if isinstance(batch, NodeTelemetry) else None
            self.samples += n
        self.reported_at += ats
        self.reported_gpus += counts
        if where:
            slots_at = np.array(where, dtype=np.intp)
            act = activities(column(usage), column(power), column(limit), column(sm), column(util))
            floats(table.cols.activity)[slots_at] = act
            floats(table.cols.seen_at)[slots_at] = np.repeat(np.array(ats), counts)

    def note_xid(self, node: str, index: int, xid: int) -> None:
        if 0 <= index < MAX_GPUS_PER_NODE and xid > 0:
            self.last_xid[(node, index)] = xid

    def fresh_batches(self, now: float | None) -> list[NodeTelemetry | bytes]:
        """The latest batch of every node whose samples are not stale at `now` (None: of every node): a node that
        stopped reporting (removed, its agent gone) leaves `/metrics` as it leaves the fleet figures, instead of
        being exported with its last values for ever."""
        interval = floats(self.slots.cols.node_interval)
        return [
            kept
            for nid, kept in enumerate(self.latest)
            if kept is not None and (now is None or now - self.latest_at[nid] <= STALE_INTERVALS * interval[nid])
        ]

    def take_reported(self) -> tuple[list[float], list[int]]:
        """The batches ingested since the last call (sample times, GPUs): the next snapshot is the first with them."""
        out = self.reported_at, self.reported_gpus
        self.reported_at, self.reported_gpus = [], []
        return out

    # ---- what changes seldom: inventory, prices, placements, the queue, cordons ----------------------------------

    def set_price(self, price: PoolPrice) -> None:
        pid = self.pools.id(price.pool)
        self.clouds.id(price.cloud)
        while len(self.prices) <= pid:
            self.prices.append(PoolPrice("", "local", 0.0))
        self.prices[pid] = price

    def set_inventory(self, node: str, pool: str, indices: Iterable[int]) -> None:
        """The node's GPUs as its inventory lists them (GPUs it no longer lists leave the totals)."""
        cols = self.slots.cols
        pid = self.pools.id(pool)
        while len(self.prices) <= pid:
            self.prices.append(PoolPrice(pool, "local", 0.0))
        for slot in self.inventory_slots.get(node, []):
            cols.in_inventory[slot] = 0
        slots = [self.slots.slot(node, i) for i in indices]
        for slot in slots:
            cols.in_inventory[slot] = 1
            cols.pool[slot] = pid
        self.inventory_slots[node] = slots

    def on_record(self, record: JobRecord) -> None:
        """A job record changed: who holds which GPU, and who waits."""
        job = record.id
        slots = []
        if holds_gpus(record):
            assert record.placement is not None
            slots = [self.slots.slot(g.node, g.index) for g in record.placement.gpus]
        if slots and self.job_slots.get(job) == slots:
            pass  # the same GPUs: its idle time goes on (found by review: every write of the record reset it)
        elif slots:
            self._release(job)
            jid = self.jobs.id(job)
            if jid >= len(self.job_idle_s):
                self.job_idle_s = np.concatenate([self.job_idle_s, np.zeros(max(64, len(self.job_idle_s)))])
            tid = self.teams.id(record.spec.team)
            cols = self.slots.cols
            for slot in slots:
                cols.job[slot] = jid
                cols.team[slot] = tid
            self.job_slots[job] = slots
        else:
            self._release(job)
        waits = record.state in WAITING and record.placement is None
        known = self.waiting.pop(job, None)
        if known is not None:
            _count(self.queue_by_team, known[0], -1)
            _count(self.queue_by_priority, known[1], -1)
        if waits:
            self.waiting[job] = (record.spec.team, record.spec.priority)
            _count(self.queue_by_team, record.spec.team, 1)
            _count(self.queue_by_priority, record.spec.priority, 1)

    def _release(self, job: str) -> None:
        slots = self.job_slots.pop(job, None)
        if slots is None:
            return
        jid = self.jobs.ids[job]
        cols = self.slots.cols
        for slot in slots:
            if cols.job[slot] == jid:
                cols.job[slot] = NONE
                cols.team[slot] = NONE
        self.job_idle_s[jid] = 0.0
        self.jobs.release(job)

    def set_cordoned(self, keys: Iterable[str]) -> None:
        """Exactly these slots (`node/index`) are cordoned now."""
        cols = self.slots.cols
        for slot in self.cordoned:
            cols.cordoned[slot] = 0
        self.cordoned = [s for s in (self.slots.slot_of_key(k) for k in keys) if s != NONE]
        for slot in self.cordoned:
            cols.cordoned[slot] = 1

    # ---- the snapshot --------------------------------------------------------------------------------------------

    def snapshot(self, now: float) -> FleetSnapshot:
        cols = self.slots.cols
        dt = 0.0 if self.last_at is None else max(0.0, now - self.last_at)
        self.last_at = now
        act = floats(cols.activity)
        interval = floats(cols.node_interval)[ints(cols.node)]
        fresh = now - floats(cols.seen_at) <= STALE_INTERVALS * interval
        inventory = flags(cols.in_inventory)
        reporting = inventory & fresh
        healthy = reporting & ~flags(cols.cordoned)
        job = ints(cols.job)
        n_pools = len(self.prices)
        pool = ints(cols.pool)
        pool = np.where(pool == NONE, n_pools, pool)  # GPUs of no known pool: an extra pool at price 0
        allocated = healthy & (job != NONE)
        # A GPU whose source tells no activity (NaN) is never taken for idle while a job holds it (it may be busy:
        # counting it idle would report its job as wasting GPUs), and an unallocated one counts as 0 (nobody's work
        # is on it); utilization and efficiency are over the GPUs whose activity is known so.
        act = np.where(np.isnan(act) & (job == NONE), 0.0, act)
        known = healthy & ~np.isnan(act)
        idle = healthy & ((job == NONE) | (act == 0.0))
        n_healthy = int(healthy.sum())
        n_known = int(known.sum())
        n_allocated = int(allocated.sum())
        cost = np.array([p.cost_per_gpu_hour for p in self.prices] + [0.0])
        cloud_of = np.array([self.clouds.id(p.cloud) for p in self.prices] + [self.clouds.id("local")], dtype=np.int32)
        spend, spend_n = _by(pool[allocated], cost, n_pools + 1)
        idle_spend, idle_n = _by(pool[idle], cost, n_pools + 1)
        spend_cloud, cloud_n = _by(cloud_of[pool[allocated]], cost[pool[allocated]], len(self.clouds), weighted=True)
        if dt:
            self._integrate_idle(allocated & idle, job, dt)
        busy = float(act[known].sum())
        useful = float(act[allocated & known].sum())
        return FleetSnapshot(
            at=now, gpus_total=int(inventory.sum()), gpus_healthy=n_healthy, gpus_allocated=n_allocated,
            gpus_reporting=int(reporting.sum()), gpus_activity_unknown=n_healthy - n_known,
            utilization=_ratio(busy, n_known), allocation_ratio=_ratio(n_allocated, n_healthy),
            idle_ratio=_ratio(int(idle.sum()), n_healthy), efficiency_score=round(100 * _ratio(useful, n_known), 2),
            idle_cost_per_hour=round(float(idle_spend.sum()), 4), spend_per_hour=round(float(spend.sum()), 4),
            queue_depth=len(self.waiting), queue_by_team={t: n for t, n in self.queue_by_team.items() if n},
            queue_by_priority={p: n for p, n in self.queue_by_priority.items() if n},
            spend_per_hour_by_pool=self._named(self.pools, spend, spend_n),
            spend_per_hour_by_cloud=self._named(self.clouds, spend_cloud, cloud_n),
            idle_spend_per_hour_by_pool=self._named(self.pools, idle_spend, idle_n),
            allocated_idle_gpu_hours_by_team={t: round(s / 3600, 4) for t, s in self.idle_seconds_by_team.items()},
            allocated_idle_gpu_hours_by_job=self._idlest_jobs(),
        )  # fmt: skip

    def _integrate_idle(self, mask: npt.NDArray[np.bool_], job: npt.NDArray[np.int32], dt: float) -> None:
        if not mask.any():
            return
        per_job = np.bincount(job[mask], minlength=len(self.job_idle_s))
        self.job_idle_s[: len(per_job)] += per_job * dt
        per_team = np.bincount(ints(self.slots.cols.team)[mask])
        for tid in np.flatnonzero(per_team):
            team = self.teams.names[tid]
            self.idle_seconds_by_team[team] = self.idle_seconds_by_team.get(team, 0.0) + float(per_team[tid]) * dt

    @staticmethod
    def _named(names: Interned, values: npt.NDArray[np.float64], counts: npt.NDArray[np.int64]) -> dict[str, float]:
        """name -> value, for the names that had any GPU counted (the extra 'no pool' entry is left out)."""
        return {names.names[i]: round(float(values[i]), 4) for i in np.flatnonzero(counts) if i < len(names)}

    def _idlest_jobs(self) -> dict[str, float]:
        idle = self.job_idle_s
        ids = np.flatnonzero(idle)
        if len(ids) > JOBS_REPORTED:
            ids = ids[np.argpartition(idle[ids], -JOBS_REPORTED)[-JOBS_REPORTED:]]
        ids = ids[np.argsort(-idle[ids], kind="stable")]
        return {self.jobs.names[i]: round(float(idle[i]) / 3600, 4) for i in ids}


def _by(
    keys: npt.NDArray[np.int32], price: npt.NDArray[np.float64], n: int, *, weighted: bool = False
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.int64]]:
    """Per key: the summed price (of each key's entry in `price`, or `price` per element when `weighted`), and
    how many elements had the key."""
    if not len(keys):
        return np.zeros(n), np.zeros(n, dtype=np.int64)
    counts = np.bincount(keys, minlength=n).astype(np.int64)
    if weighted:
        return np.bincount(keys, weights=price, minlength=n).astype(np.float64), counts
    return (counts * price[:n]).astype(np.float64), counts


def _count(counts: dict[str, int], key: str, delta: int) -> None:
    counts[key] = counts.get(key, 0) + delta


def _ratio(part: float, whole: float) -> float:
    return round(part / whole, 4) if whole else 0.0
