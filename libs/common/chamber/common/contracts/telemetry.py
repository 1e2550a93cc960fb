"""Per-GPU samples, batched per node, and XID events pushed the moment NVML reports them.

A capability a GPU lacks (older GPUs, MIG, a driver without the call) is an absent (None) field, never a zero
that could be mistaken for a reading.
"""

from typing import Annotated, Literal

import msgspec

from chamber.common.contracts.base import Contract, Event

MAX_GPUS_PER_NODE = 1024
"""GPU indices above this are garbage (a node has 8 or 16; MIG instances are not separate indices here)."""


class GpuProcess(Contract, frozen=True):
    pid: int
    used_memory_mb: float | None = None
    job_id: str = ""
    """The job whose replica this process belongs to, as the node agent knows it; empty: none (or not known)."""


class GpuSample(Contract, frozen=True):
    index: int
    uuid: str
    gpu_util: float | None = None
    """Percent of time a kernel ran (NVML utilization.gpu; DCGM_FI_DEV_GPU_UTIL)."""
    mem_util: float | None = None
    mem_used_mb: float | None = None
    mem_total_mb: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    ecc_dbe_volatile: int | None = None
    ecc_sbe_volatile: int | None = None
    xids: list[int] = msgspec.field(default_factory=list)
    sm_activity: float | None = None
    """0-1: share of SMs busy over the sample interval (NVML GPM SM utilization; DCGM_FI_PROF_SM_ACTIVE)."""
    tensor_activity: float | None = None
    """0-1: share of time the SMs ran any tensor operation (GPM; DCGM_FI_PROF_PIPE_TENSOR_ACTIVE)."""
    dram_activity: float | None = None
    """0-1: DRAM bandwidth used over its maximum (GPM; DCGM_FI_PROF_DRAM_ACTIVE)."""
    usage: float | None = None
    """0-100: 100 x max(SM, tensor, DRAM activity); 0 under 10% of the power limit; None without GPM counters."""
    clock_event_reasons: int | None = None
    """NVML clocks-event (throttle) reason bitmask."""
    ecc_dbe_aggregate: int | None = None
    ecc_sbe_aggregate: int | None = None
    retired_pages_dbe: int | None = None
    retired_pages_sbe: int | None = None
    retired_pages_pending: bool | None = None
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    nvlink_replay_errors: int | None = None
    nvlink_recovery_errors: int | None = None
    nvlink_crc_errors: int | None = None
    pcie_replay_count: int | None = None
    processes: list[GpuProcess] | None = None
    recovery_action: int | None = None
    """NVML's GPU recovery action (0 none, 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and reset)."""
    unallocated_processes: int | None = None
    """Processes on this GPU that no job placed on it owns (rogue work the ledger does not know); None when the
    source cannot tell (no process list, or no job runner on the node)."""
    job_id: str = ""
    """The Chamber job whose pod the kubelet gave this device to (read back through the kubelet's PodResources API
    on Kubernetes); empty: none, or not known (no PodResources, or a pod that is not Chamber's)."""
    pod: str = ""
    """`namespace/name` of the pod the kubelet gave this device to (any pod, Chamber's or not); empty: none."""


class NodeTelemetry(Event, frozen=True):
    node: str
    sampled_at: float
    interval_s: float
    gpus: list[GpuSample]
    source: str = "sim"
    """`nvml` from a node agent, `sim` from the simulated fleet."""
    assignment_mismatches: list[str] = msgspec.field(default_factory=list)
    """Where the kubelet's device assignments (PodResources) disagree with the ledger's placements on this node,
    one sentence each (docs/kubernetes.md); empty when they agree or when the agent cannot read them."""


class GpuXidEvent(Event, frozen=True):
    """An XID error, published as soon as NVML's event set reports it (not at the next sample)."""

    node: str
    gpu_index: int
    uuid: str
    xid: int
    observed_at: float


TelemetryEvent = NodeTelemetry | GpuXidEvent


class GpuActivityView(msgspec.Struct, frozen=True, gc=False):
    """The part of a `GpuSample` that fleet metrics need. Decoding the same bytes into this view skips building
    every other field: the aggregator ingests 100,000 GPUs a second this way."""

    index: Annotated[int, msgspec.Meta(ge=0, lt=MAX_GPUS_PER_NODE)]
    gpu_util: float | None = None
    sm_activity: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    usage: float | None = None


class NodeActivityView(msgspec.Struct, frozen=True, tag_field="kind", tag="NodeTelemetry"):
    """A `NodeTelemetry` message, seen through `GpuActivityView`."""

    node: str
    sampled_at: float
    interval_s: float
    gpus: list[GpuActivityView]


class XidEventView(msgspec.Struct, frozen=True, tag_field="kind", tag="GpuXidEvent"):
    """A `GpuXidEvent`, seen by a consumer that only needs to know it is one."""

    node: str


TelemetryActivityView = NodeActivityView | XidEventView


class FaultInjection(Event, frozen=True):
    """Make the simulated fleet show a fault (demos, tests, the health benchmark); real node agents ignore it."""

    node: str
    fault: Literal["xid", "dbe", "row_remap_failure", "nvlink_replay", "thermal", "heartbeat_loss", "clear"]
    gpu: int | None = None
    value: int = 0
    duration_s: float | None = None
