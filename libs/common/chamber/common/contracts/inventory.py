"""What hardware exists: pools, nodes, GPUs and the topology labels placement uses."""

from typing import Annotated

import msgspec

from chamber.common.contracts.base import Contract, Event

Name = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$(?!\n)")]


class TopologyLabels(Contract, frozen=True):
    """Where a node sits. Placement keeps gangs inside one NVLink domain, rack or zone when asked."""

    zone: str = "zone-a"
    rack: str = ""
    nvlink_domain: str = ""


class GpuDevice(Contract, frozen=True):
    """A schedulable GPU: a whole GPU, or one MIG instance of a GPU in MIG mode (then listed instead of it)."""

    index: int
    uuid: str
    """`GPU-...`, or `MIG-...` for a MIG instance (what `CUDA_VISIBLE_DEVICES` takes)."""
    model: str
    memory_mb: int = 0
    mig_profile: str = ""
    """The MIG instance's profile (`1g.10gb`, `3g.40gb` ...); empty for a whole GPU."""
    parent_uuid: str = ""
    """For a MIG instance: the UUID of the GPU it is carved from."""


class MigSlices(Contract, frozen=True):
    """MIG instances of one profile that Kubernetes offers as their own resource (`nvidia.com/mig-<profile>`,
    GPU Feature Discovery's `mixed` strategy). Recorded, not booked: Chamber's jobs ask for `nvidia.com/gpu`."""

    profile: str
    """`1g.10gb`, `3g.40gb` ..."""
    count: int
    memory_mb: int = 0


class Node(Contract, frozen=True):
    name: Name
    pool: str
    gpus: list[GpuDevice]
    topology: TopologyLabels = TopologyLabels()
    cluster: str = "local"
    mig_slices: list[MigSlices] = msgspec.field(default_factory=list)
    """MIG instances offered per profile beside `gpus` (mixed strategy); not part of what Chamber places on."""
    unreadable_gpus: int = msgspec.field(default=0)
    """GPUs the node has (NVML counts them) that its agent could not read when it started (one that fell off the
    bus): not in `gpus`, never placed on, and counted by health as GPUs the node should report (gpu-count-drop)."""


class Pool(Contract, frozen=True):
    """A capacity pool: one GPU model in one cluster, with its price."""

    name: str
    gpu_model: str
    cost_per_gpu_hour: float = 0.0
    cluster: str = "local"


class NodeInventory(Event, frozen=True):
    """The full inventory of one node; the last one per node subject is the truth."""

    node: Node
    pool: Pool
    observed_at: float
