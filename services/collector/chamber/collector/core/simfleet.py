"""A simulated fleet: nodes of GPUs in racks and zones, with activity that follows the jobs placed on them.

Deterministic for a seed: the same seed and inputs give the same samples, so tests and demos repeat.
"""

import random
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

import msgspec

from chamber.common.contracts import (
    GpuDevice,
    GpuSample,
    Node,
    NodeInventory,
    NodeTelemetry,
    Pool,
    TopologyLabels,
)

MEMORY_MB = {"H100": 81_559, "H200": 143_771, "A100": 81_920, "L40S": 46_068}
POWER_LIMIT_W = {"H100": 700.0, "H200": 700.0, "A100": 400.0, "L40S": 350.0}


GPU_IDLE = 0x01  # NVML clocks-event reason: nothing runs on the GPU
SW_POWER_CAP = 0x04  # NVML clocks-event reason: clocks held to the power limit
THERMAL_SLOWDOWN = 0x20  # NVML clocks-event reason: HW thermal slowdown
FAULTS = ("xid", "dbe", "row_remap_failure", "nvlink_replay", "thermal", "heartbeat_loss")


@dataclass(frozen=True, slots=True)
class PoolShape:
    name: str
    gpu_model: str
    nodes: int
    cost_per_gpu_hour: float
    cloud: str = "local"


@dataclass(frozen=True, slots=True)
class FleetShape:
    nodes: int = 16
    gpus_per_node: int = 8
    nodes_per_rack: int = 4
    racks_per_zone: int = 8
    gpu_model: str = "H100"
    pool: str = "default"
    cost_per_gpu_hour: float = 2.5
    interval_s: float = 5.0
    pools: tuple[PoolShape, ...] = ()
    """Several pools (models, prices); when empty, one pool of `nodes` x `gpu_model`."""

    def pool_shapes(self) -> tuple[PoolShape, ...]:
        return self.pools or (PoolShape(self.pool, self.gpu_model, self.nodes, self.cost_per_gpu_hour),)


@dataclass
class Fault:
    kind: str
    value: int = 0
    until: float | None = None


class SimulatedFleet:
    """Per-GPU activity follows the job on it: training runs busy with periodic data-loading dips; about one job
    in ten is an idle notebook that holds its GPUs at idle power. Faults can be injected per GPU."""

    def __init__(self, shape: FleetShape, seed: int = 0) -> None:
        self.shape = shape
        self.rng = random.Random(seed)
        self.nodes: list[Node] = []
        self.pools: dict[str, Pool] = {}
        self.faults: dict[str, list[Fault]] = {}
        self.silent: set[str] = set()
        self._counters: dict[str, dict[str, int]] = {}
        i = 0
        for ps in shape.pool_shapes():
            self.pools[ps.name] = Pool(
                name=ps.name, gpu_model=ps.gpu_model, cost_per_gpu_hour=ps.cost_per_gpu_hour, cluster=ps.cloud
            )
            for _ in range(ps.nodes):
                self.nodes.append(self._node(i, ps))
                i += 1

    def _node(self, i: int, ps: PoolShape) -> Node:
        s = self.shape
        rack = i // s.nodes_per_rack
        name = f"node-{i:04d}"
        gpus = [
            GpuDevice(
                index=g,
                uuid=f"GPU-{self.rng.getrandbits(128):032x}",
                model=ps.gpu_model,
                memory_mb=MEMORY_MB.get(ps.gpu_model, 81_920),
            )
            for g in range(s.gpus_per_node)
        ]
        topo = TopologyLabels(zone=f"zone-{rack // s.racks_per_zone}", rack=f"rack-{rack:03d}", nvlink_domain=name)
        return Node(name=name, pool=ps.name, gpus=gpus, topology=topo)

    def inventory(self, now: float) -> list[NodeInventory]:
        return [NodeInventory(node=n, pool=self.pools[n.pool], observed_at=now) for n in self.nodes]

    def inject(self, node: str, gpu: int | None, kind: str, *, value: int = 0, until: float | None = None) -> None:
        """Inject a fault: `xid` (value = the XID), `dbe`, `row_remap_failure`, `nvlink_replay`, `thermal`, or
        `heartbeat_loss` (the whole node goes silent; `gpu` is ignored)."""
        if kind not in FAULTS:
            raise ValueError(f"unknown fault {kind!r}; one of {', '.join(FAULTS)}")
        if kind == "heartbeat_loss":
            self.silent.add(node)
            return
        self.faults.setdefault(f"{node}/{gpu}", []).append(Fault(kind, value, until))

    def clear(self, node: str, gpu: int | None = None) -> None:
        """The fault is repaired (a GPU reset, a reboot): counters are back to zero, the node reports again."""
        self.silent.discard(node)
        for slot in [s for s in self._counters if s.startswith(f"{node}/") and (gpu is None or s == f"{node}/{gpu}")]:
            del self._counters[slot]
        for slot in [s for s in self.faults if s.startswith(f"{node}/") and (gpu is None or s == f"{node}/{gpu}")]:
            del self.faults[slot]

    def sample(self, now: float, allocation: Mapping[str, str]) -> list[NodeTelemetry]:
        """`allocation`: slot -> the job holding it."""
        batches = []
        for node in self.nodes:
            if node.name in self.silent:
                continue
            model = self.pools[node.pool].gpu_model
            limit = POWER_LIMIT_W.get(model, 700.0)
            samples = []
            for gpu in node.gpus:
                slot = f"{node.name}/{gpu.index}"
                job = allocation.get(slot)
                util = self._activity(job, now)
                power = limit * (0.07 + 0.85 * util / 100)
                sample = GpuSample(
                    index=gpu.index,
                    uuid=gpu.uuid,
                    gpu_util=round(util, 1),
                    mem_util=round(util * 0.6, 1),
                    mem_used_mb=round(gpu.memory_mb * (0.7 if job else 0.0), 1),
                    mem_total_mb=float(gpu.memory_mb),
                    temperature_c=round(32 + util * 0.4 + self.rng.uniform(-1, 1), 1),
                    power_w=round(power, 1),
                    power_limit_w=limit,
                    clock_event_reasons=_clock_events(util, power, limit),
                    ecc_dbe_volatile=0,
                    ecc_sbe_volatile=0,
                    remapped_rows_pending=False,
                    remapped_rows_failure=False,
                    nvlink_replay_errors=0,
                    pcie_replay_count=0,
                )
                faults = self.faults.get(slot)
                if faults:
                    sample = self._apply_faults(slot, sample, faults, now)
                samples.append(sample)
            batches.append(
                NodeTelemetry(node=node.name, sampled_at=now, interval_s=self.shape.interval_s, gpus=samples)
            )
        return batches

    def _activity(self, job: str | None, now: float) -> float:
        if job is None:
            return 0.0
        h = zlib.crc32(job.encode())
        if h % 10 == 0:
            return 0.0  # an idle notebook holding its GPU
        if (now + h % 60) % 60 < 5:
            return self.rng.uniform(3, 12)  # waiting for the next batch of data
        return self.rng.uniform(70, 99)

    def _apply_faults(self, slot: str, sample: GpuSample, faults: list[Fault], now: float) -> GpuSample:
        counters = self._counters.setdefault(slot, {})
        changes: dict[str, object] = {}
        for fault in list(faults):
            if fault.until is not None and now >= fault.until:
                faults.remove(fault)
                continue
            if fault.kind == "xid":
                changes["xids"] = [fault.value or 79]
                faults.remove(fault)  # an XID is an event: reported once
            elif fault.kind == "dbe":
                counters["dbe"] = counters.get("dbe", 0) + 1
                changes["ecc_dbe_volatile"] = counters["dbe"]
            elif fault.kind == "row_remap_failure":
                changes["remapped_rows_failure"] = True
            elif fault.kind == "nvlink_replay":
                counters["replay"] = counters.get("replay", 0) + (fault.value or 100)
                changes["nvlink_replay_errors"] = counters["replay"]
            elif fault.kind == "thermal":
                changes["temperature_c"] = 95.0
                changes["clock_event_reasons"] = THERMAL_SLOWDOWN
        return msgspec.structs.replace(sample, **changes) if changes else sample


def _clock_events(util: float, power_w: float, limit_w: float) -> int:
    """The clocks-event reasons a healthy GPU reports, as a real H200 did: GPU idle when nothing runs, the SW power
    cap when it works near its power limit (which health must not take for a fault)."""
    if util == 0.0:
        return GPU_IDLE
    return SW_POWER_CAP if power_w >= 0.85 * limit_w else 0
