"""The node agent's read-back of what the kubelet actually gave each pod: its PodResources API (gRPC on a unix
socket, `/var/lib/kubelet/pod-resources/kubelet.sock`; the Helm DaemonSet mounts that directory read-only), as
dcgm-exporter reads it.

Every `interval_s` it calls `List` and joins the `nvidia.com/gpu` devices with this node's Chamber pods (followed
through the Kubernetes API: label `chamber.io/job-id`, field `spec.nodeName`), keeping the latest `Attribution`
for the NVML source to put on each sample (`chamber.collector.core.assignments` says what is checked). A change in
what disagrees with the ledger is logged once (`agent.gpu_assignment_mismatch`); every telemetry batch carries it.
The generated stubs come from `podresources.proto` at install time (setup.py), as the gateway's do.
"""

import asyncio
import contextlib
from collections.abc import Sequence

import grpc

from chamber.collector.agent import podresources_pb2 as pb
from chamber.collector.agent import podresources_pb2_grpc as pb_grpc
from chamber.collector.core.assignments import Attribution, ChamberPod, DeviceAssignment, attribute
from chamber.common.kube import labels as L
from chamber.common.kube.client import PODS, KubeClient, Obj
from chamber.common.kube.watch import Reflector
from chamber.common.kube.workloads import annotations_of, gpus_of_pod_spec, labels_of, meta, pod_attempt
from chamber.common.log import get_logger

log = get_logger(__name__)
DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
"""Where the kubelet serves PodResources (the kubelet's `--pod-resources-socket` default)."""


class PodResourcesError(Exception):
    """The kubelet's PodResources API did not answer (socket missing, kubelet restarting, feature off)."""


class PodResourcesClient:
    """`List` and `GetAllocatableResources` of the kubelet's PodResources v1 API."""

    def __init__(self, socket_path: str = DEFAULT_SOCKET, *, timeout_s: float = 5.0) -> None:
        self.socket_path = socket_path
        self.timeout_s = timeout_s
        self._channel = grpc.aio.insecure_channel(f"unix://{socket_path}")
        self._stub = pb_grpc.PodResourcesListerStub(self._channel)

    async def assignments(self) -> list[DeviceAssignment]:
        """Every container's devices, one entry per (container, resource)."""
        try:
            reply: pb.ListPodResourcesResponse = await self._stub.List(
                pb.ListPodResourcesRequest(), timeout=self.timeout_s
            )
        except grpc.aio.AioRpcError as exc:
            raise PodResourcesError(f"List on {self.socket_path}: {exc.code().name} {exc.details()}") from exc
        return [
            DeviceAssignment(
                namespace=pod.namespace,
                pod=pod.name,
                container=container.name,
                resource=devices.resource_name,
                device_ids=tuple(devices.device_ids),
            )
            for pod in reply.pod_resources
            for container in pod.containers
            for devices in container.devices
        ]

    async def allocatable(self, resource: str = L.GPU_RESOURCE) -> list[str]:
        """The device ids of `resource` the kubelet can assign on this node."""
        try:
            reply: pb.AllocatableResourcesResponse = await self._stub.GetAllocatableResources(
                pb.AllocatableResourcesRequest(), timeout=self.timeout_s
            )
        except grpc.aio.AioRpcError as exc:
            raise PodResourcesError(
                f"GetAllocatableResources on {self.socket_path}: {exc.code().name} {exc.details()}"
            ) from exc
        return [d for devices in reply.devices if devices.resource_name == resource for d in devices.device_ids]

    async def close(self) -> None:
        await self._channel.close()


def chamber_pod(pod: Obj) -> ChamberPod | None:
    """A Chamber pod as the join needs it; None for a pod without `chamber.io/job-id`."""
    job = labels_of(pod).get(L.JOB_ID)
    if not job:
        return None
    placement = tuple(n for n in annotations_of(pod).get(L.PLACEMENT, "").split(",") if n)
    return ChamberPod(
        namespace=str(meta(pod).get("namespace") or "default"), name=str(meta(pod).get("name") or ""), job_id=job,
        attempt=pod_attempt(pod), gpus=gpus_of_pod_spec(pod.get("spec") or {}), placement=placement,
        running=(pod.get("status") or {}).get("phase") == "Running",
    )  # fmt: skip


class Assignments:
    """The latest attribution of this node's devices (`latest`), refreshed every `interval_s`."""

    def __init__(
        self, client: PodResourcesClient, node: str, devices: Sequence[str], *, kube: KubeClient | None = None,
        interval_s: float = 10.0,
    ) -> None:  # fmt: skip
        self.client = client
        self.node = node
        self.devices = list(devices)
        self.kube = kube
        self.interval_s = interval_s
        self.latest: Attribution | None = None
        """None until the kubelet first answered (then samples carry no attribution rather than a wrong one)."""
        self.pods: Reflector | None = None
        if kube is not None:
            self.pods = Reflector(kube, PODS, _ignore, labels=L.JOB_ID, fields=f"spec.nodeName={node}",
                                  name=f"pods/{node}")  # fmt: skip
        self._reported: tuple[str, ...] = ()

    def chamber_pods(self) -> list[ChamberPod]:
        if self.pods is None:
            return []
        return [p for obj in self.pods.objects.values() if (p := chamber_pod(obj)) is not None]

    async def refresh(self) -> Attribution:
        """One `List`, joined with the pods as last seen."""
        listed = await self.client.assignments()
        self.latest = attribute(listed, self.chamber_pods(), node=self.node, devices=self.devices)
        if self.latest.mismatches != self._reported:
            for line in self.latest.mismatches:
                if line not in self._reported:
                    log.warning("agent.gpu_assignment_mismatch", node=self.node, mismatch=line)
            self._reported = self.latest.mismatches
        return self.latest

    async def run(self, stop: asyncio.Event) -> None:
        tasks = [asyncio.create_task(self.pods.run(stop))] if self.pods is not None else []
        try:
            while not stop.is_set():
                try:
                    await self.refresh()
                except PodResourcesError as exc:
                    log.warning("agent.pod_resources_unavailable", node=self.node, error=str(exc))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=self.interval_s)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.client.close()
            if self.kube is not None:
                await self.kube.close()


async def _ignore(kind: str, obj: Obj) -> None:
    """The reflector keeps the pods in `objects`; nothing to do per event."""
