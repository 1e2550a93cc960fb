"""The telemetry of a noisy, healthy fleet, and faults of every rule family injected into it.

Noise is what healthy GPUs really show, per GPU and per week (`Noise`): utilization, power and temperature
jitter; isolated correctable ECC errors; single NVLink CRC and PCIe replay blips; brief thermal throttles; and per
node, samples that arrive late and agent restarts that leave a node silent for a while. None of it may quarantine.

A `Fault` is one rule family's failure on one GPU (or node) from `onset`; `reference` is the moment its rule's
own window closes (the sample that completes the rule): the quarantine is measured from there.
"""

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, field

from chamber.common.contracts import GpuSample, NodeTelemetry
from chamber.health.core.rules import DEFAULT_RULES

GPUS_PER_NODE = 8
WEEK_S = 7 * 86400.0
THERMAL = 0x20  # HW thermal slowdown


@dataclass(frozen=True)
class Noise:
    """Events per GPU (or node) per week, and their sizes."""

    sbe_bursts: float = 5.0
    sbe_per_burst: tuple[int, int] = (1, 3)
    nvlink_blips: float = 3.0
    nvlink_per_blip: tuple[int, int] = (1, 5)
    pcie_blips: float = 2.0
    pcie_per_blip: tuple[int, int] = (1, 4)
    throttles: float = 10.0
    throttle_s: tuple[float, float] = (1.0, 8.0)
    restarts_per_node: float = 1.0
    restart_silence_s: tuple[float, float] = (5.0, 20.0)
    late_share: float = 0.001
    """Share of samples that arrive late, by up to `late_s`."""
    late_s: float = 3.0

    def scaled(self, factor: float) -> "Noise":
        """The same noise, `factor` times as often (a short live run sees as much as a long stretch would)."""
        return Noise(self.sbe_bursts * factor, self.sbe_per_burst, self.nvlink_blips * factor, self.nvlink_per_blip,
                     self.pcie_blips * factor, self.pcie_per_blip, self.throttles * factor, self.throttle_s,
                     self.restarts_per_node * factor, self.restart_silence_s, self.late_share, self.late_s)  # fmt: skip


FAMILIES = ("xid", "dbe", "ecc_rate", "row_remap", "nvlink_rate", "pcie_rate", "thermal", "heartbeat", "gpu_drop")
"""One fault per rule family: (how it shows, which rule must fire)."""
RULE_OF = {
    "xid": "xid-gsp", "dbe": "ecc-dbe-volatile", "ecc_rate": "ecc-sbe-rate", "row_remap": "row-remap-pending",
    "nvlink_rate": "nvlink-error-rate", "pcie_rate": "pcie-replay-rate", "thermal": "thermal-throttle-sustained",
    "heartbeat": "heartbeat-loss", "gpu_drop": "gpu-count-drop",
}  # fmt: skip
NODE_FAMILIES = ("heartbeat", "gpu_drop")


@dataclass
class Fault:
    family: str
    node: str
    gpu: int
    onset: float
    samples: list[float] = field(default_factory=list)
    """Times of the samples that showed it (heartbeat: the last sample before the silence)."""

    @property
    def node_scoped(self) -> bool:
        return self.family in NODE_FAMILIES


@dataclass
class GpuState:
    sbe: int = 0
    nvlink: int = 0
    pcie: int = 0
    throttled_until: float = -math.inf


@dataclass
class NodeState:
    name: str
    gpus: list[GpuState]
    silent_until: float = -math.inf


class NoisyFleet:
    """Samples for every node at any time: noise drawn per sample interval, and the faults injected so far."""

    def __init__(self, nodes: int, noise: Noise, interval_s: float, seed: int = 7) -> None:
        self.rng = random.Random(seed)
        self.noise = noise
        self.interval_s = interval_s
        self.nodes = [NodeState(f"node-{n:05d}", [GpuState() for _ in range(GPUS_PER_NODE)]) for n in range(nodes)]
        per_interval = interval_s / WEEK_S
        self.p_sbe = noise.sbe_bursts * per_interval
        self.p_nvlink = noise.nvlink_blips * per_interval
        self.p_pcie = noise.pcie_blips * per_interval
        self.p_throttle = noise.throttles * per_interval
        self.p_restart = noise.restarts_per_node * per_interval
        self.faults: dict[tuple[str, int], Fault] = {}

    def inject(self, family: str, node: int, gpu: int, at: float) -> Fault:
        fault = Fault(family, self.nodes[node].name, gpu, at)
        self.faults[(fault.node, -1 if fault.node_scoped else gpu)] = fault
        return fault

    def sample_node(self, node: NodeState, at: float) -> NodeTelemetry | None:
        """The node's batch at `at` (None: it is silent: restarting, or lost to a heartbeat fault)."""
        rng = self.rng
        if at < node.silent_until:
            return None
        if rng.random() < self.p_restart:
            lo, hi = self.noise.restart_silence_s
            node.silent_until = at + rng.uniform(lo, hi)
            return None
        lost = self.faults.get((node.name, -1))
        if lost is not None and lost.family == "heartbeat" and at >= lost.onset:
            return None
        gpus = [self._gpu(node, i, g, at) for i, g in enumerate(node.gpus)]
        if lost is not None and lost.family == "gpu_drop" and at >= lost.onset:
            gpus = gpus[:-1]
            lost.samples.append(at)
        elif lost is not None and lost.family == "heartbeat":
            lost.samples.append(at)
        return NodeTelemetry(node=node.name, sampled_at=at, interval_s=self.interval_s, gpus=gpus, source="nvml")

    def late_by(self) -> float:
        """How late this sample arrives (0 for most)."""
        return self.rng.uniform(0, self.noise.late_s) if self.rng.random() < self.noise.late_share else 0.0

    def _gpu(self, node: NodeState, index: int, g: GpuState, at: float) -> GpuSample:
        rng, n = self.rng, self.noise
        if rng.random() < self.p_sbe:
            g.sbe += rng.randint(*n.sbe_per_burst)
        if rng.random() < self.p_nvlink:
            g.nvlink += rng.randint(*n.nvlink_per_blip)
        if rng.random() < self.p_pcie:
            g.pcie += rng.randint(*n.pcie_per_blip)
        if rng.random() < self.p_throttle:
            g.throttled_until = at + rng.uniform(*n.throttle_s)
        reasons = THERMAL if at < g.throttled_until else 0
        dbe, pending = 0, False
        fault = self.faults.get((node.name, index))
        if fault is not None and at >= fault.onset:
            fault.samples.append(at)
            family = fault.family
            if family == "dbe":
                dbe = 1
            elif family == "ecc_rate":
                g.sbe += int(50 * self.interval_s)
            elif family == "row_remap":
                pending = True
            elif family == "nvlink_rate":
                g.nvlink += int(50 * self.interval_s)
            elif family == "pcie_rate":
                g.pcie += int(40 * self.interval_s)
            elif family == "thermal":
                reasons = THERMAL
        return GpuSample(
            index=index, uuid=f"GPU-{node.name}-{index}", gpu_util=min(100.0, max(0.0, rng.gauss(85, 8))),
            mem_util=rng.uniform(20, 60), temperature_c=rng.gauss(62, 3), power_w=rng.gauss(520, 40),
            power_limit_w=700.0, ecc_dbe_volatile=dbe, ecc_sbe_volatile=g.sbe, clock_event_reasons=reasons,
            remapped_rows_pending=pending, remapped_rows_failure=False, nvlink_replay_errors=0,
            nvlink_recovery_errors=0, nvlink_crc_errors=g.nvlink, pcie_replay_count=g.pcie,
            recovery_action=0,
        )  # fmt: skip


def reference(fault: Fault, silence_limit_s: float, count: int = 3) -> float | None:
    """When the fault's rule has all it needs, from the fault's own samples (None: it never had); a sustained rule
    (thermal, gpu-count-drop) at the first sample that has shown it for the rule's `sustain_s`."""
    family, seen = fault.family, fault.samples
    sustain_s = next(r.sustain_s for r in DEFAULT_RULES if r.name == RULE_OF[family])
    if family == "heartbeat":
        return (seen[-1] if seen else fault.onset) + silence_limit_s
    if family == "xid":
        return fault.onset
    if family in ("ecc_rate", "nvlink_rate", "pcie_rate"):
        # A rate needs the sample before the first faulty one; the count-th faulty sample completes the rule.
        return seen[count - 1] if len(seen) >= count else None
    if sustain_s:
        return next((t for t in seen if t - seen[0] >= sustain_s), None) if seen else None
    return seen[0] if seen else None


def spread(items: int, over_s: float, start: float) -> Iterator[float]:
    """`items` moments spread evenly over `over_s` seconds from `start`."""
    for i in range(items):
        yield start + over_s * i / max(1, items)
