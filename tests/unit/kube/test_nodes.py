"""Kubernetes nodes as inventory, and the node changes of a quarantine and its release."""

from typing import Any

from chamber.cli.kubesim.semantics import merge_patch
from chamber.common.kube.nodes import (
    cloud_of,
    gone,
    gpu_model,
    inventory,
    mig_slices,
    quarantine_patch,
    release_patch,
)


def node(**labels: str) -> dict[str, Any]:
    return {
        "metadata": {"name": "gpu-1", "resourceVersion": "7", "labels": {
            "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.memory": "81559",
            "topology.kubernetes.io/zone": "us-east-1a", "chamber.io/rack": "r12", **labels}},
        "spec": {"providerID": "aws:///us-east-1a/i-0abc"},
        "status": {"allocatable": {"nvidia.com/gpu": "8"}, "conditions": [{"type": "Ready", "status": "True"}]},
    }  # fmt: skip


def test_a_gpu_node_becomes_inventory_with_its_labels() -> None:
    inv = inventory(node(**{"chamber.io/pool": "h100-spot"}), default_pool="default", pool_label="chamber.io/pool",
                    cost_per_gpu_hour=2.0, now=5.0)  # fmt: skip
    assert inv.node.name == "gpu-1"
    assert len(inv.node.gpus) == 8
    assert inv.node.pool == "h100-spot"
    assert inv.pool.gpu_model == "H100"
    assert inv.node.gpus[0].memory_mb == 81559
    assert (inv.node.topology.zone, inv.node.topology.rack) == ("us-east-1a", "r12")
    assert inv.node.cluster == "aws"


def test_clouds_models_and_nodes_that_are_not_ready_or_gone() -> None:
    assert cloud_of({"spec": {"providerID": "gce://proj/zone/vm"}}) == "gcp"
    assert cloud_of({"spec": {}}) == "on-prem"
    assert gpu_model({"metadata": {"labels": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}}}) == "A100"
    not_ready = node()
    not_ready["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    assert inventory(not_ready, default_pool="d", pool_label="p", cost_per_gpu_hour=0, now=0).node.gpus == []
    assert gone("gpu-1", pool="d", now=1.0).node.gpus == []


def test_quarantine_cordons_and_taints_and_release_undoes_only_what_chamber_did() -> None:
    original = node()
    original["spec"]["taints"] = [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}]
    patch = quarantine_patch(original, "health: xid-79: GPU fell off the bus")
    assert patch["metadata"]["resourceVersion"] == "7", "a concurrent change becomes a conflict, not a lost taint"
    quarantined = merge_patch(original, patch)
    assert quarantined["spec"]["unschedulable"] is True
    keys = [t["key"] for t in quarantined["spec"]["taints"]]
    assert keys == ["dedicated", "chamber.io/gpu-unhealthy"]
    value = quarantined["spec"]["taints"][1]["value"]
    assert len(value) <= 63
    assert value[0].isalnum()
    assert value[-1].isalnum()
    released = merge_patch(quarantined, release_patch(quarantined))
    assert released["spec"]["taints"] == original["spec"]["taints"]
    assert "unschedulable" not in released["spec"]
    assert release_patch(released) is None, "nothing left to undo"
    operator_cordoned = node()
    operator_cordoned["spec"]["unschedulable"] = True
    again = merge_patch(operator_cordoned, quarantine_patch(operator_cordoned, "x"))
    assert merge_patch(again, release_patch(again))["spec"]["unschedulable"] is True, "an operator's cordon stays"


def test_mig_slices_of_the_mixed_strategy_are_recorded_beside_the_whole_gpus_and_not_booked() -> None:
    mixed = node(**{"nvidia.com/mig.strategy": "mixed", "nvidia.com/mig-1g.10gb.count": "14",
                    "nvidia.com/mig-1g.10gb.memory": "9728", "nvidia.com/mig-3g.40gb.count": "2",
                    "nvidia.com/mig-3g.40gb.memory": "40192"})  # fmt: skip
    mixed["status"]["allocatable"] = {"nvidia.com/gpu": "6", "nvidia.com/mig-1g.10gb": "13",
                                      "nvidia.com/mig-3g.40gb": "2", "cpu": "96"}  # fmt: skip
    inv = inventory(mixed, default_pool="d", pool_label="p", cost_per_gpu_hour=0, now=0)
    assert len(inv.node.gpus) == 6, "nvidia.com/gpu: the GPUs not in MIG mode, what Chamber books"
    assert [(s.profile, s.count, s.memory_mb) for s in inv.node.mig_slices] == [
        ("1g.10gb", 13, 9728), ("3g.40gb", 2, 40192),
    ], "the device plugin's healthy slices per profile, GFD's memory"  # fmt: skip
    labelled_only = node(**{"nvidia.com/mig-2g.20gb.count": "3"})
    assert [(s.profile, s.count) for s in mig_slices(labelled_only)] == [("2g.20gb", 3)], "GFD's count as fallback"
    assert mig_slices(node()) == [], "no MIG, or the single strategy: nothing beside nvidia.com/gpu"
