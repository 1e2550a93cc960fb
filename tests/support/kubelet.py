"""A faithful stand-in for the kubelet's PodResources v1 gRPC API: a real gRPC server on a unix socket that answers
`List` and `GetAllocatableResources` from what a test says the device plugin gave each container."""

import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc

from chamber.collector.agent import podresources_pb2 as pb
from chamber.collector.agent import podresources_pb2_grpc as pb_grpc

Pods = dict[tuple[str, str], dict[str, list[str]]]
"""(namespace, pod) -> container -> its nvidia.com/gpu device ids."""


class FakeKubelet(pb_grpc.PodResourcesListerServicer):  # type: ignore[misc]  # generated gRPC code is untyped
    """The kubelet's side of the API: answers from `pods` (what the device plugin gave each container)."""

    def __init__(self, pods: Pods, allocatable: list[str]) -> None:
        self.pods = pods
        self.allocatable = allocatable

    async def List(self, request: pb.ListPodResourcesRequest, context: Any) -> pb.ListPodResourcesResponse:
        return pb.ListPodResourcesResponse(pod_resources=[
            pb.PodResources(name=name, namespace=ns, containers=[
                pb.ContainerResources(name=c, devices=[
                    pb.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=ids,
                                        topology=pb.TopologyInfo(nodes=[pb.NUMANode(ID=0)])),
                ], cpu_ids=[0, 1]) for c, ids in containers.items()
            ]) for (ns, name), containers in self.pods.items()
        ])  # fmt: skip

    async def GetAllocatableResources(
        self, request: pb.AllocatableResourcesRequest, context: Any
    ) -> pb.AllocatableResourcesResponse:
        devices = [pb.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=self.allocatable)]
        return pb.AllocatableResourcesResponse(devices=devices, cpu_ids=[0, 1, 2, 3])


@contextlib.contextmanager
def short_socket_dir() -> Iterator[Path]:
    """A short directory: a unix socket path must fit in 108 bytes."""
    path = Path(tempfile.mkdtemp(prefix="podres-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@contextlib.asynccontextmanager
async def kubelet(socket: Path, pods: Pods, allocatable: list[str]) -> AsyncIterator[FakeKubelet]:
    server = grpc.aio.server()
    servicer = FakeKubelet(pods, allocatable)
    pb_grpc.add_PodResourcesListerServicer_to_server(servicer, server)
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    try:
        yield servicer
    finally:
        await server.stop(grace=None)
