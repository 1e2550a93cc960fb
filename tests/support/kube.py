"""Helpers for tests against the emulated Kubernetes API with the official client."""

import asyncio
from collections.abc import Callable
from typing import Any

from kubernetes import client


def official(url: str) -> client.ApiClient:
    cfg = client.Configuration()
    cfg.host = url
    return client.ApiClient(cfg)


async def call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """The official client is synchronous: run its calls off the test's event loop. (Any: its models make every
    field Optional, which tests would have to narrow at each step.)"""
    return await asyncio.to_thread(fn, *args, **kwargs)


def gpu_job(
    name: str, *, team: str = "nlp", replicas: int = 1, gpus: int = 8, seconds: float | None = None,
    priority: str = "train", grace_s: int = 1, team_label: str = "chamber.io/team",
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:  # fmt: skip
    ann = dict(annotations or {})
    if seconds is not None:
        ann["chamber.io/sim-duration-s"] = str(seconds)
    spec: dict[str, Any] = {
        "parallelism": replicas, "completions": replicas, "backoffLimit": 0,
        "template": {"spec": {
            "restartPolicy": "Never", "terminationGracePeriodSeconds": grace_s,
            "containers": [
                {"name": "main", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
            ],
        }},
    }  # fmt: skip
    if replicas > 1:
        spec["completionMode"] = "Indexed"
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "labels": {team_label: team, "chamber.io/priority": priority}, "annotations": ann},
        "spec": spec,
    }  # fmt: skip


def training_runtime(
    name: str = "torch-chamber", *, gpus: int = 8, nodes: int = 1, scheduler: str | None = "chamber",
    kind: str = "ClusterTrainingRuntime", initializer: bool = True, grace_s: int = 1,
) -> dict[str, Any]:  # fmt: skip
    """A Kubeflow Trainer v2 training runtime shaped like the trainer's `torch-distributed`: a GPU-less dataset
    initializer (when `initializer`) and the `node` trainer step, whose pods ask for `gpus` and are placed by
    `scheduler`."""
    pod: dict[str, Any] = {
        "restartPolicy": "Never", "terminationGracePeriodSeconds": grace_s,
        "containers": [{"name": "node", "image": "pytorch/pytorch", "command": ["torchrun", "train.py"],
                        "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
    }  # fmt: skip
    if scheduler is not None:
        pod["schedulerName"] = scheduler
    rjobs: list[dict[str, Any]] = []
    if initializer:
        rjobs.append({"name": "dataset-initializer", "replicas": 1, "template": {
            "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "dataset-initializer"}},
            "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [
                {"name": "dataset-initializer", "image": "ghcr.io/kubeflow/trainer/dataset-initializer"}]}}},
        }})  # fmt: skip
    rjobs.append({"name": "node", "replicas": 1, "template": {
        "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
        "spec": {"backoffLimit": 0, "template": {"spec": pod}},
    }})  # fmt: skip
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": kind, "metadata": {"name": name},
        "spec": {"mlPolicy": {"numNodes": nodes, "torch": {"numProcPerNode": "auto"}},
                 "template": {"spec": {"replicatedJobs": rjobs}}},
    }  # fmt: skip


def trainjob(
    name: str, *, runtime: str = "torch-chamber", nodes: int | None = None, gpus: int | None = None,
    seconds: float | None = None, team: str = "nlp", priority: str = "train", runtime_kind: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    """A TrainJob on `runtime`; `nodes` and `gpus` (per node) override the runtime's when given."""
    trainer: dict[str, Any] = {}
    if nodes is not None:
        trainer["numNodes"] = nodes
    if gpus is not None:
        trainer["resourcesPerNode"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    ref: dict[str, Any] = {"name": runtime}
    if runtime_kind is not None:
        ref.update(apiGroup="trainer.kubeflow.org", kind=runtime_kind)
    ann = {"chamber.io/sim-duration-s": str(seconds)} if seconds is not None else {}
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
        "metadata": {"name": name, "labels": {"chamber.io/team": team, "chamber.io/priority": priority},
                     "annotations": ann},
        "spec": {"runtimeRef": ref, "trainer": trainer},
    }  # fmt: skip
