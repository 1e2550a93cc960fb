"""Quarantine on the cluster: a node-level verdict cordons and taints the Kubernetes node and evicts its pods.

Next to the ledger cordon (which stops Chamber placing anything there), a quarantined node is made
unschedulable for everyone: `spec.unschedulable`, the taint `chamber.io/gpu-unhealthy:NoSchedule`, and every pod
on it evicted through the Eviction API, so PodDisruptionBudgets are honoured (an eviction a budget forbids is
retried every few seconds until it is allowed or the node is released). A release removes the taint and
uncordons the node if Chamber cordoned it (an operator's own cordon stays).

A verdict about one GPU changes nothing on the node: under the NVIDIA device plugin the kubelet, not the
scheduler, chooses which GPU a pod gets, so one GPU cannot be fenced off from Kubernetes here (the device plugin
itself withdraws GPUs it finds unhealthy); the ledger cordon keeps Chamber's own count right (docs/kubernetes.md).
"""

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any

from chamber.common.kube.client import NODES, PODS, KubeClient, Obj
from chamber.common.kube.errors import KubeConflict, KubeError, KubeNotFound, KubeTooManyRequests
from chamber.common.kube.nodes import quarantine_patch, release_patch
from chamber.common.kube.workloads import meta
from chamber.common.log import get_logger

log = get_logger(__name__)
RETRY_S = 5.0


class NodeQuarantine:
    def __init__(self, client: KubeClient, *, retry_s: float = RETRY_S) -> None:
        self.client = client
        self.retry_s = retry_s
        self._work: dict[str, asyncio.Task[None]] = {}
        """node -> its quarantine or release in progress (a newer verdict replaces an older one)."""

    def quarantine(self, node: str, reason: str) -> None:
        self._replace(node, self._quarantine(node, reason))

    def release(self, node: str) -> None:
        self._replace(node, self._release(node))

    def _replace(self, node: str, work: Coroutine[Any, Any, None]) -> None:
        old = self._work.pop(node, None)
        if old is not None:
            old.cancel()
        task = asyncio.create_task(work, name=f"kube-quarantine-{node}")
        self._work[node] = task

        def done(t: asyncio.Task[None]) -> None:
            if self._work.get(node) is t:
                del self._work[node]

        task.add_done_callback(done)

    async def _patch(self, node: str, build: Callable[[Obj], Obj | None]) -> bool:
        """Read-modify-write with the node's resource version; a conflict is retried on a fresh read."""
        for _ in range(10):
            try:
                obj = await self.client.get(NODES, node)
                patch = build(obj)
                if patch is None:
                    return True
                await self.client.patch(NODES, node, patch)
                return True
            except KubeConflict:
                continue
            except KubeNotFound:
                return False
        return False

    async def _quarantine(self, node: str, reason: str) -> None:
        while True:
            try:
                if not await self._patch(node, lambda obj: quarantine_patch(obj, reason)):
                    return
                log.warning("kube_quarantine.node_cordoned", node=node, reason=reason)
                if await self._evict_all(node):
                    return
            except KubeError as exc:
                log.warning("kube_quarantine.failed", node=node, error=str(exc))
            await asyncio.sleep(self.retry_s)

    async def _evict_all(self, node: str) -> bool:
        """Evict every pod on the node except DaemonSet pods; True when none is left to evict."""
        pods, _ = await self.client.list(PODS, fields=f"spec.nodeName={node}")
        blocked = 0
        for pod in pods:
            owners = meta(pod).get("ownerReferences") or []
            if any(o.get("kind") == "DaemonSet" for o in owners) or meta(pod).get("deletionTimestamp"):
                continue
            try:
                await self.client.evict(meta(pod)["namespace"], meta(pod)["name"])
                log.warning("kube_quarantine.evicted", node=node, pod=meta(pod)["name"])
            except KubeTooManyRequests as exc:
                blocked += 1
                log.info("kube_quarantine.eviction_blocked", node=node, pod=meta(pod)["name"], reason=str(exc))
            except KubeNotFound:
                pass
        return blocked == 0

    async def _release(self, node: str) -> None:
        with contextlib.suppress(KubeError):
            if await self._patch(node, release_patch):
                log.info("kube_quarantine.node_released", node=node)

    async def close(self) -> None:
        for task in list(self._work.values()):
            task.cancel()
        await asyncio.gather(*self._work.values(), return_exceptions=True)
        await self.client.close()
