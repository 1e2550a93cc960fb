"""Kubernetes nodes as Chamber inventory, and the node changes a quarantine makes: pure, on plain dicts.

Discovery reads what the NVIDIA GPU Operator puts on a node: allocatable `nvidia.com/gpu` (the device plugin's
count of healthy GPUs), GPU Feature Discovery labels (`nvidia.com/gpu.product`, `.memory`, `.count`, MIG), the
well-known zone label and a rack / NVLink-domain label, `spec.providerID` (which cloud, or on-prem), and a pool
label. A node without GPUs is not part of the fleet.

MIG under GFD's `mixed` strategy: the device plugin offers each MIG profile as its own resource
(`nvidia.com/mig-1g.10gb: 7`) beside `nvidia.com/gpu` (the node's GPUs not in MIG mode), and GFD labels each
profile (`nvidia.com/mig-1g.10gb.count`, `.memory`). Those slices are recorded on the node (`Node.mig_slices`) but
not booked: a Chamber job asks for `nvidia.com/gpu`, which a MIG slice cannot satisfy under this strategy.
"""

import re
from typing import Any

from chamber.common.contracts import GpuDevice, MigSlices, Node, NodeInventory, Pool, TopologyLabels
from chamber.common.kube import labels as L
from chamber.common.kube.workloads import annotations_of, labels_of, meta

Obj = dict[str, Any]

MIG_RESOURCE = re.compile(r"^nvidia\.com/mig-(\d+g\.\d+gb(?:\+[a-z]+)?)$")
"""A mixed-strategy MIG resource (`nvidia.com/mig-3g.40gb`, `nvidia.com/mig-1g.10gb+me`): its profile."""
MIG_COUNT_LABEL = re.compile(r"^nvidia\.com/mig-(\d+g\.\d+gb(?:\+[a-z]+)?)\.count$")
PROVIDERS = {"aws": "aws", "gce": "gcp", "azure": "azure", "oci": "oci", "ibmcloud": "ibm", "kind": "local"}


def cloud_of(node: Obj) -> str:
    """`aws`, `gcp`, `azure` ... from `spec.providerID` (`aws:///us-east-1a/i-0abc`); `on-prem` without one."""
    provider_id = str((node.get("spec") or {}).get("providerID") or "")
    if "://" not in provider_id:
        return "on-prem"
    scheme = provider_id.split("://", 1)[0]
    return PROVIDERS.get(scheme, scheme)


def gpu_count(node: Obj) -> int:
    status = node.get("status") or {}
    raw = (status.get("allocatable") or {}).get(L.GPU_RESOURCE) or (status.get("capacity") or {}).get(L.GPU_RESOURCE)
    if raw is None:
        raw = labels_of(node).get(L.GFD_COUNT, "0")
    try:
        return int(str(raw))
    except ValueError:
        return 0


def mig_slices(node: Obj) -> list[MigSlices]:
    """The MIG profiles a node offers as their own resources (mixed strategy): counts from allocatable (the
    device plugin's healthy slices), else GFD's `nvidia.com/mig-<profile>.count`; memory from GFD's
    `nvidia.com/mig-<profile>.memory` (MiB). Empty without MIG or under the `single` strategy."""
    lab = labels_of(node)
    status = node.get("status") or {}
    counts: dict[str, int] = {}
    for key, raw in (status.get("allocatable") or status.get("capacity") or {}).items():
        if (m := MIG_RESOURCE.match(key)) is not None:
            counts[m.group(1)] = _int(raw)
    if not counts:
        counts = {m.group(1): _int(raw) for key, raw in lab.items() if (m := MIG_COUNT_LABEL.match(key)) is not None}
    return [
        MigSlices(profile=p, count=c, memory_mb=_int(lab.get(f"nvidia.com/mig-{p}.memory", "0")))
        for p, c in sorted(counts.items())
        if c > 0
    ]


def _int(raw: object) -> int:
    try:
        return int(str(raw))
    except ValueError:
        return 0


def gpu_model(node: Obj) -> str:
    """GFD's product name, shortened to the family Chamber's pools and jobs name (`NVIDIA-H100-80GB-HBM3` ->
    `H100`)."""
    product = labels_of(node).get(L.GFD_PRODUCT, "")
    for part in product.replace("_", "-").split("-"):
        if part and part[0].isalpha() and any(ch.isdigit() for ch in part) and part.upper() != "HBM3":
            return part.upper()
    return product or "unknown"


def is_ready(node: Obj) -> bool:
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return bool(cond.get("status") == "True")
    return False


def inventory(node: Obj, *, default_pool: str, pool_label: str, cost_per_gpu_hour: float, now: float) -> NodeInventory:
    """The inventory of one node; a node that is gone, not ready, or has no GPUs has none."""
    lab = labels_of(node)
    name = str(meta(node).get("name"))
    usable = is_ready(node) and not meta(node).get("deletionTimestamp")
    count = gpu_count(node) if usable else 0
    model = gpu_model(node)
    try:
        memory_mb = int(lab.get(L.GFD_MEMORY, "0"))
    except ValueError:
        memory_mb = 0
    rack = next((lab[k] for k in L.RACK_LABELS if lab.get(k)), "")
    nvlink = next((lab[k] for k in L.NVLINK_LABELS if lab.get(k)), "")
    cloud = cloud_of(node)
    pool = Pool(name=lab.get(pool_label) or default_pool, gpu_model=model, cost_per_gpu_hour=cost_per_gpu_hour,
                cluster=cloud)  # fmt: skip
    gpus = [GpuDevice(index=i, uuid="", model=model, memory_mb=memory_mb) for i in range(count)]
    topo = TopologyLabels(zone=lab.get(L.ZONE, "zone-a"), rack=rack, nvlink_domain=nvlink)
    slices = mig_slices(node) if usable else []
    return NodeInventory(node=Node(name=name, pool=pool.name, gpus=gpus, topology=topo, cluster=cloud,
                                   mig_slices=slices), pool=pool, observed_at=now)  # fmt: skip


def gone(name: str, *, pool: str, now: float) -> NodeInventory:
    """The inventory of a node that left the cluster: no GPUs (the node's subject keeps this last word)."""
    return NodeInventory(node=Node(name=name, pool=pool, gpus=[]), pool=Pool(name=pool, gpu_model=""), observed_at=now)


def mig_strategy(node: Obj) -> str:
    """GFD's MIG strategy (`none`, `single`, `mixed`): Chamber books `nvidia.com/gpu`, which is every GPU (`none`),
    every MIG slice (`single`), or the GPUs not in MIG mode (`mixed`, whose slices are `mig_slices`)."""
    return labels_of(node).get(L.GFD_MIG_STRATEGY, "none")


# ---- quarantine ------------------------------------------------------------------------------------------------


def quarantine_patch(node: Obj, reason: str) -> Obj:
    """Merge patch that cordons a node and taints it `chamber.io/gpu-unhealthy:NoSchedule`. Taints are an atomic
    list in the API (strategic merge replaces it too), so the patch carries the whole new list and the node's
    resource version: a concurrent change makes it a conflict to retry, never a lost taint."""
    taints = [t for t in (node.get("spec") or {}).get("taints") or [] if t.get("key") != L.UNHEALTHY_TAINT]
    taints.append({"key": L.UNHEALTHY_TAINT, "value": _label_value(reason), "effect": "NoSchedule"})
    patch: Obj = {"metadata": {"resourceVersion": meta(node).get("resourceVersion")}, "spec": {"taints": taints}}
    if not (node.get("spec") or {}).get("unschedulable"):
        patch["spec"]["unschedulable"] = True
        patch["metadata"]["annotations"] = {L.CORDONED_BY: "chamber"}
    return patch


def release_patch(node: Obj) -> Obj | None:
    """Merge patch that removes Chamber's taint, and uncordons the node if Chamber cordoned it. None: nothing to
    undo."""
    spec = node.get("spec") or {}
    taints = spec.get("taints") or []
    kept = [t for t in taints if t.get("key") != L.UNHEALTHY_TAINT]
    ours = annotations_of(node).get(L.CORDONED_BY) == "chamber"
    if len(kept) == len(taints) and not ours:
        return None
    patch: Obj = {"metadata": {"resourceVersion": meta(node).get("resourceVersion")}, "spec": {"taints": kept or None}}
    if ours:
        patch["spec"]["unschedulable"] = None
        patch["metadata"]["annotations"] = {L.CORDONED_BY: None}
    return patch


def is_quarantined(node: Obj) -> bool:
    return any(t.get("key") == L.UNHEALTHY_TAINT for t in (node.get("spec") or {}).get("taints") or [])


def _label_value(text: str) -> str:
    """A taint value: at most 63 characters of `[A-Za-z0-9._-]`, starting and ending alphanumeric."""
    cleaned = "".join(ch if ch.isalnum() or ch in "._-" else "-" for ch in text)[:63].strip("._-")
    return cleaned or "unhealthy"
