"""Which job holds each GPU device, as the kubelet assigned it, checked against the ledger's placements.

On Kubernetes the ledger books GPU *counts* per node and the device plugin, not Chamber, picks the devices a
container gets. The node agent reads the kubelet's answer back (its PodResources API, as dcgm-exporter does) and
joins it with this node's Chamber pods (label `chamber.io/job-id`): each device is then attributed to the job
whose pod holds it, so telemetry and XIDs name the right job. The same join checks the ledger: every pod of an
attempt carries the placement the ledger made (`chamber.io/placement`, the node of each replica), so the GPUs the
ledger booked for a job on this node are (its replicas placed here) x (GPUs per replica), and the kubelet must
have given its pods here exactly that many of this node's devices.

Pure: the shell (`chamber.collector.agent.kubelet`) fetches the kubelet's list and the pods; this joins them.
"""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

GPU_RESOURCE = "nvidia.com/gpu"


@dataclass(frozen=True, slots=True)
class DeviceAssignment:
    """One container's devices of one resource, as the kubelet's `List` reports them."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_ids: tuple[str, ...]

    @property
    def pod_key(self) -> str:
        return f"{self.namespace}/{self.pod}"


@dataclass(frozen=True, slots=True)
class ChamberPod:
    """A pod of a Chamber job bound to this node, as the API shows it."""

    namespace: str
    name: str
    job_id: str
    attempt: int | None
    gpus: int
    """GPUs it asks for: what the ledger booked per replica."""
    placement: tuple[str, ...]
    """The node of each replica of its attempt (the ledger's placement, from `chamber.io/placement`)."""
    running: bool

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class Attribution:
    job_of: dict[str, str] = field(default_factory=dict)
    """Device id (a GPU or MIG UUID) -> the Chamber job whose pod holds it."""
    pod_of: dict[str, str] = field(default_factory=dict)
    """Device id -> `namespace/name` of the pod holding it (any pod)."""
    mismatches: tuple[str, ...] = ()
    """Where the kubelet's assignments disagree with the ledger or with this node's devices, one sentence each."""


def attribute(
    assignments: Iterable[DeviceAssignment], pods: Iterable[ChamberPod], *, node: str, devices: Sequence[str],
    resource: str = GPU_RESOURCE,
) -> Attribution:  # fmt: skip
    """Join the kubelet's device assignments with this node's Chamber pods. `devices`: this node's device ids as
    NVML reports them (GPU UUIDs, and MIG UUIDs for MIG instances)."""
    chamber = {p.key: p for p in pods}
    known = set(devices)
    job_of: dict[str, str] = {}
    pod_of: dict[str, str] = {}
    holders: dict[str, list[str]] = {}
    given: dict[str, int] = {}
    """job -> devices the kubelet gave its pods here."""
    mismatches: list[str] = []
    for a in assignments:
        if a.resource != resource:
            continue
        owner = chamber.get(a.pod_key)
        for device in a.device_ids:
            holders.setdefault(device, []).append(f"{a.pod_key}/{a.container}")
            pod_of[device] = a.pod_key
            if owner is None:
                continue
            job_of[device] = owner.job_id
            given[owner.job_id] = given.get(owner.job_id, 0) + 1
            if known and device not in known:
                mismatches.append(f"device {device} of pod {a.pod_key} (job {owner.job_id}) is not a GPU of {node}")
    for device, where in sorted(holders.items()):
        if len(where) > 1:
            mismatches.append(f"device {device} is assigned to {len(where)} containers: {', '.join(sorted(where))}")
    by_job: dict[str, list[ChamberPod]] = {}
    for pod in chamber.values():
        by_job.setdefault(pod.job_id, []).append(pod)
    for job, its in sorted(by_job.items()):
        booked = _booked(its, node)
        got = given.get(job, 0)
        settled = all(p.running for p in its)
        if got > booked or (settled and got != booked):
            mismatches.append(
                f"job {job}: the ledger booked {booked} GPU(s) on {node}, the kubelet gave its pods here {got}"
            )
    return Attribution(job_of, pod_of, tuple(mismatches))


def _booked(pods: Sequence[ChamberPod], node: str) -> int:
    """GPUs the ledger booked for one job on `node`: its replicas placed here x GPUs per replica (the newest
    attempt's placement: an older attempt's pods are on their way out)."""
    newest = max(pods, key=lambda p: p.attempt or 0)
    return newest.placement.count(node) * newest.gpus
