"""A simulated fleet: nodes of GPUs in racks and zones, with activity that follows the jobs placed on them.

Deterministic for a seed: the same seed and inputs give the same samples, so tests and demos repeat.
"""

import random
from dataclasses import dataclass

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


class SimulatedFleet:
    def __init__(self, shape: FleetShape, seed: int = 0) -> None:
        self.shape = shape
        self.rng = random.Random(seed)
        self.pool = Pool(name=shape.pool, gpu_model=shape.gpu_model, cost_per_gpu_hour=shape.cost_per_gpu_hour)
        self.nodes = [self._node(i) for i in range(shape.nodes)]

    def _node(self, i: int) -> Node:
        s = self.shape
        rack = i // s.nodes_per_rack
        name = f"node-{i:04d}"
        gpus = [
            GpuDevice(
                index=g,
                uuid=f"GPU-{self.rng.getrandbits(128):032x}",
                model=s.gpu_model,
                memory_mb=MEMORY_MB.get(s.gpu_model, 81_920),
            )
            for g in range(s.gpus_per_node)
        ]
        topo = TopologyLabels(zone=f"zone-{rack // s.racks_per_zone}", rack=f"rack-{rack:03d}", nvlink_domain=name)
        return Node(name=name, pool=s.pool, gpus=gpus, topology=topo)

    def inventory(self, now: float) -> list[NodeInventory]:
        return [NodeInventory(node=n, pool=self.pool, observed_at=now) for n in self.nodes]

    def sample(self, now: float, busy_slots: frozenset[str]) -> list[NodeTelemetry]:
        limit = POWER_LIMIT_W.get(self.shape.gpu_model, 700.0)
        batches = []
        for node in self.nodes:
            samples = []
            for gpu in node.gpus:
                busy = f"{node.name}/{gpu.index}" in busy_slots
                util = self.rng.uniform(70, 99) if busy else 0.0
                samples.append(
                    GpuSample(
                        index=gpu.index,
                        uuid=gpu.uuid,
                        gpu_util=round(util, 1),
                        mem_util=round(util * 0.6, 1),
                        mem_used_mb=round(gpu.memory_mb * (0.7 if busy else 0.0), 1),
                        mem_total_mb=float(gpu.memory_mb),
                        temperature_c=round(32 + util * 0.4 + self.rng.uniform(-1, 1), 1),
                        power_w=round(limit * (0.12 + 0.8 * util / 100), 1),
                        power_limit_w=limit,
                        ecc_dbe_volatile=0,
                        ecc_sbe_volatile=0,
                    )
                )
            batches.append(
                NodeTelemetry(node=node.name, sampled_at=now, interval_s=self.shape.interval_s, gpus=samples)
            )
        return batches
