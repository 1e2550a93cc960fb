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
