"""Per-GPU samples, batched per node, and XID events pushed the moment NVML reports them.

A capability a GPU lacks (older GPUs, MIG, a driver without the call) is an absent (None) field, never a zero
that could be mistaken for a reading.

On the wire a node's batch is `NodeTelemetryColumns`: one list per `GpuSample` field instead of one object per
GPU. 12,500 nodes send one each a second; as rows an H100 node's batch is 6.5 KB that repeats every field name
per GPU and costs every consumer an object per GPU, while fleet metrics read five columns of it and scatter them
into numpy at once. Code works with `NodeTelemetry` (`to_columns` / `from_columns` convert, and
`as_telemetry` turns a decoded `TelemetryWire` message into it); the row form is still accepted from older publishers.
"""

import operator
from typing import Annotated, Any, Literal

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
    boot_id: str = ""
    """The node's Linux boot ID (`/proc/sys/kernel/random/boot_id`) from a node agent; empty: not known. A new one
    is a reboot: evidence that a fault only a reset clears is gone (health)."""


class GpuXidEvent(Event, frozen=True):
    """An XID error, published as soon as NVML's event set reports it (not at the next sample)."""

    node: str
    gpu_index: int
    uuid: str
    xid: int
    observed_at: float


TelemetryEvent = NodeTelemetry | GpuXidEvent


class NodeTelemetryColumns(Event, frozen=True):
    """A `NodeTelemetry` as it is published: entry `i` of every list belongs to GPU `index[i]`.

    `index` and `uuid` have one entry per GPU. Every other list has one entry per GPU, or none at all: then the
    field has its default (absent, no XIDs) on every GPU, which keeps capabilities a node lacks off the wire.
    Anything else is garbage and fails to decode. Fields added to `GpuSample` get a column here (a test checks)."""

    node: str
    sampled_at: float
    interval_s: float
    source: str = "sim"
    index: list[int] = msgspec.field(default_factory=list)
    uuid: list[str] = msgspec.field(default_factory=list)
    gpu_util: list[float | None] = msgspec.field(default_factory=list)
    mem_util: list[float | None] = msgspec.field(default_factory=list)
    mem_used_mb: list[float | None] = msgspec.field(default_factory=list)
    mem_total_mb: list[float | None] = msgspec.field(default_factory=list)
    temperature_c: list[float | None] = msgspec.field(default_factory=list)
    power_w: list[float | None] = msgspec.field(default_factory=list)
    power_limit_w: list[float | None] = msgspec.field(default_factory=list)
    ecc_dbe_volatile: list[int | None] = msgspec.field(default_factory=list)
    ecc_sbe_volatile: list[int | None] = msgspec.field(default_factory=list)
    xids: list[list[int]] = msgspec.field(default_factory=list)
    sm_activity: list[float | None] = msgspec.field(default_factory=list)
    tensor_activity: list[float | None] = msgspec.field(default_factory=list)
    dram_activity: list[float | None] = msgspec.field(default_factory=list)
    usage: list[float | None] = msgspec.field(default_factory=list)
    clock_event_reasons: list[int | None] = msgspec.field(default_factory=list)
    ecc_dbe_aggregate: list[int | None] = msgspec.field(default_factory=list)
    ecc_sbe_aggregate: list[int | None] = msgspec.field(default_factory=list)
    retired_pages_dbe: list[int | None] = msgspec.field(default_factory=list)
    retired_pages_sbe: list[int | None] = msgspec.field(default_factory=list)
    retired_pages_pending: list[bool | None] = msgspec.field(default_factory=list)
    remapped_rows_correctable: list[int | None] = msgspec.field(default_factory=list)
    remapped_rows_uncorrectable: list[int | None] = msgspec.field(default_factory=list)
    remapped_rows_pending: list[bool | None] = msgspec.field(default_factory=list)
    remapped_rows_failure: list[bool | None] = msgspec.field(default_factory=list)
    nvlink_replay_errors: list[int | None] = msgspec.field(default_factory=list)
    nvlink_recovery_errors: list[int | None] = msgspec.field(default_factory=list)
    nvlink_crc_errors: list[int | None] = msgspec.field(default_factory=list)
    pcie_replay_count: list[int | None] = msgspec.field(default_factory=list)
    processes: list[list[GpuProcess] | None] = msgspec.field(default_factory=list)
    recovery_action: list[int | None] = msgspec.field(default_factory=list)
    unallocated_processes: list[int | None] = msgspec.field(default_factory=list)
    job_id: list[str] = msgspec.field(default_factory=list)
    pod: list[str] = msgspec.field(default_factory=list)
    assignment_mismatches: list[str] = msgspec.field(default_factory=list)
    """Of the node, not per GPU: as `NodeTelemetry.assignment_mismatches`."""
    boot_id: str = ""
    """Of the node: as `NodeTelemetry.boot_id`."""

    def __post_init__(self) -> None:
        n = len(self.index)
        if len(self.uuid) != n:
            raise ValueError(f"{len(self.uuid)} uuids for {n} GPUs")
        lengths = set(map(len, _optional_columns(msgspec.structs.astuple(self))))
        if not lengths <= {0, n}:
            raise ValueError(f"columns of {sorted(lengths - {0, n})} entries for {n} GPUs")


_COLUMNS = GpuSample.__struct_fields__
_REQUIRED = ("index", "uuid")
_OPTIONAL_COLUMNS = tuple(name for name in _COLUMNS if name not in _REQUIRED)


def _default(name: str) -> Any:
    field = next(f for f in msgspec.structs.fields(GpuSample) if f.name == name)
    return field.default_factory() if field.default is msgspec.NODEFAULT else field.default


_DEFAULTS = {name: _default(name) for name in _OPTIONAL_COLUMNS}
_optional_columns = operator.itemgetter(*(NodeTelemetryColumns.__struct_fields__.index(c) for c in _OPTIONAL_COLUMNS))
"""The optional columns out of `astuple(NodeTelemetryColumns)` (checked in C, not field by field in Python)."""


_optional_of = operator.attrgetter(*_OPTIONAL_COLUMNS)
_FILLS = tuple(_DEFAULTS[name] for name in _OPTIONAL_COLUMNS)
_LIST_DEFAULTS = [i for i, name in enumerate(_OPTIONAL_COLUMNS) if isinstance(_DEFAULTS[name], list)]
if any(isinstance(d, dict | set) for d in _FILLS):
    raise TypeError("from_columns gives each GPU its own list only: teach it the new mutable default")


def to_columns(batch: NodeTelemetry) -> NodeTelemetryColumns:
    """The wire form of a batch; a column whose every entry is the field's default is left empty."""
    n = len(batch.gpus)
    rows = [msgspec.structs.astuple(s) for s in batch.gpus]
    columns = dict(zip(_COLUMNS, map(list, zip(*rows, strict=True)) if n else ([] for _ in _COLUMNS), strict=True))
    for name, default in _DEFAULTS.items():
        if columns[name].count(default) == n:
            columns[name] = []
    return NodeTelemetryColumns(
        node=batch.node, sampled_at=batch.sampled_at, interval_s=batch.interval_s, source=batch.source, v=batch.v,
        assignment_mismatches=batch.assignment_mismatches, boot_id=batch.boot_id, **columns,
    )  # fmt: skip


def from_columns(batch: NodeTelemetryColumns) -> NodeTelemetry:
    """The batch a consumer works with (the columns were checked to be consistent when decoded).

    Each sample is built from all its fields by position, the way pickle rebuilds a Struct (`__reduce__`): 0.2 us
    a GPU, where keyword arguments took 2 us and doubled what health spends per batch."""
    n = len(batch.index)
    columns = _optional_of(batch)
    full = [column or [default] * n for column, default in zip(columns, _FILLS, strict=True)]
    for i in _LIST_DEFAULTS:
        if not columns[i]:
            full[i] = [[] for _ in range(n)]  # each GPU its own list
    full[:0] = (batch.index, batch.uuid)
    gpus = [GpuSample(*row) for row in zip(*full, strict=True)]
    return NodeTelemetry(
        node=batch.node, sampled_at=batch.sampled_at, interval_s=batch.interval_s, gpus=gpus, source=batch.source,
        v=batch.v, assignment_mismatches=batch.assignment_mismatches, boot_id=batch.boot_id,
    )  # fmt: skip


TelemetryWire = NodeTelemetryColumns | NodeTelemetry | GpuXidEvent
"""What `telemetry.<node>` carries (then `as_telemetry`)."""


def as_telemetry(event: NodeTelemetryColumns | NodeTelemetry | GpuXidEvent) -> TelemetryEvent:
    """A decoded `TelemetryWire` message as consumers handle it: batches as `NodeTelemetry`."""
    return from_columns(event) if isinstance(event, NodeTelemetryColumns) else event


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


_Index = Annotated[int, msgspec.Meta(ge=0, lt=MAX_GPUS_PER_NODE)]
_Floats = Annotated[list[float | None], msgspec.Meta(max_length=MAX_GPUS_PER_NODE)]


class NodeColumnsActivityView(msgspec.Struct, frozen=True, tag_field="kind", tag="NodeTelemetryColumns"):
    """A `NodeTelemetryColumns` message seen through the five columns fleet metrics need (an empty one: absent on
    every GPU); the other columns are skipped, not built. Inconsistent lengths fail to decode, as in the full form."""

    node: str
    sampled_at: float
    interval_s: float
    index: Annotated[list[_Index], msgspec.Meta(max_length=MAX_GPUS_PER_NODE)] = msgspec.field(default_factory=list)
    gpu_util: _Floats = msgspec.field(default_factory=list)
    sm_activity: _Floats = msgspec.field(default_factory=list)
    power_w: _Floats = msgspec.field(default_factory=list)
    power_limit_w: _Floats = msgspec.field(default_factory=list)
    usage: _Floats = msgspec.field(default_factory=list)

    def __post_init__(self) -> None:
        n = len(self.index)
        for column in (self.gpu_util, self.sm_activity, self.power_w, self.power_limit_w, self.usage):
            if len(column) != n and column:
                raise ValueError(f"a column has {len(column)} entries for {n} GPUs")


class XidEventView(msgspec.Struct, frozen=True, tag_field="kind", tag="GpuXidEvent"):
    """A `GpuXidEvent`, seen by the metrics aggregator: which GPU, which XID (`DCGM_FI_DEV_XID_ERRORS`)."""

    node: str
    gpu_index: int = -1
    xid: int = 0


TelemetryActivityView = NodeColumnsActivityView | NodeActivityView | XidEventView


class FaultInjection(Event, frozen=True):
    """Make the simulated fleet show a fault (demos, tests, the health benchmark); real node agents ignore it."""

    node: str
    fault: Literal["xid", "dbe", "row_remap_failure", "nvlink_replay", "thermal", "heartbeat_loss", "clear"]
    gpu: int | None = None
    value: int = 0
    duration_s: float | None = None
