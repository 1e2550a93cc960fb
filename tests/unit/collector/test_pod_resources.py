"""The node agent reads back what the kubelet gave each pod through the PodResources v1 gRPC API, from a real
gRPC server on a unix socket that serves `List` and `GetAllocatableResources` as the kubelet does, joins it with
the node's Chamber pods from the (emulated) Kubernetes API, and puts the job on each GPU's telemetry."""

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chamber.cli.kubesim.serve import emulated_cluster
from chamber.collector.agent.kubelet import Assignments, PodResourcesClient, PodResourcesError
from chamber.collector.core.metrics import FleetMetrics
from chamber.collector.nvml import NvmlReader, NvmlSource
from chamber.collector.prometheus import ChamberCollector
from chamber.common.codec import encode
from chamber.common.contracts import Pool, TopologyLabels
from chamber.common.kube.client import PODS, KubeClient
from chamber.common.settings import Settings
from tests.support.fakenvml import H100, FakeNvml
from tests.support.kubelet import Pods, kubelet, short_socket_dir
from tests.support.services import eventually


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    with short_socket_dir() as path:
        yield path


UUIDS = [f"GPU-fake-{i}" for i in range(4)]


async def test_the_client_lists_each_containers_devices_and_the_allocatable_gpus(socket_dir: Path) -> None:
    sock = socket_dir / "kubelet.sock"
    pods: Pods = {("ml", "llm-0"): {"trainer": UUIDS[:2], "sidecar": []}, ("lab", "nb"): {"main": [UUIDS[3]]}}
    async with kubelet(sock, pods, UUIDS):
        client = PodResourcesClient(str(sock))
        listed = await client.assignments()
        assert {(a.pod_key, a.container, a.device_ids) for a in listed} == {
            ("ml/llm-0", "trainer", ("GPU-fake-0", "GPU-fake-1")), ("ml/llm-0", "sidecar", ()),
            ("lab/nb", "main", ("GPU-fake-3",)),
        }  # fmt: skip
        assert await client.allocatable() == UUIDS
        await client.close()
    gone = PodResourcesClient(str(sock), timeout_s=1.0)
    with pytest.raises(PodResourcesError, match="UNAVAILABLE"):
        await gone.assignments()
    await gone.close()


def chamber_pod(name: str, node: str, job: str, *, placement: str, gpus: int = 2) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"chamber.io/job-id": job},
                     "annotations": {"chamber.io/attempt": "1", "chamber.io/placement": placement}},
        "spec": {"nodeName": node, "schedulerName": "chamber", "containers": [
            {"name": "trainer", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]},
    }  # fmt: skip


async def test_the_agent_attributes_each_gpu_to_the_job_the_kubelet_gave_it_and_reports_a_mismatch(
    socket_dir: Path,
) -> None:
    sock = socket_dir / "kubelet.sock"
    async with emulated_cluster(Settings(fleet_nodes=2), tick_s=0.05) as cluster:
        node, other = sorted(n["metadata"]["name"] for n in cluster.api.read_all("/v1/nodes"))
        kc = KubeClient.connect(cluster.url)
        await kc.create(PODS, chamber_pod("llm-0", node, "k8s-llm", placement=f"{node},{other}"), "ml")
        await kc.create(PODS, chamber_pod("llm-1", other, "k8s-llm", placement=f"{node},{other}"), "ml")
        pods: Pods = {("ml", "llm-0"): {"trainer": UUIDS[:2]}, ("lab", "notebook"): {"main": [UUIDS[3]]}}
        async with kubelet(sock, pods, UUIDS) as fake:
            assignments = Assignments(PodResourcesClient(str(sock)), node, UUIDS, kube=kc, interval_s=0.1)
            assert assignments.pods is not None
            reflecting = assignments.pods
            stop = asyncio.Event()
            task = asyncio.create_task(assignments.run(stop))
            await eventually(reflecting.synced.is_set, within=5, what="the node's pods listed")

            async def running() -> bool:
                attribution = await assignments.refresh()
                return attribution.job_of.get("GPU-fake-0") == "k8s-llm" and all(
                    p.running for p in assignments.chamber_pods()
                )

            await eventually(running, within=5, what="the kubelet's assignment joined with the running pod")
            assert [p.name for p in assignments.chamber_pods()] == ["llm-0"], "only this node's Chamber pods"
            source = NvmlSource(NvmlReader(FakeNvml([H100 | {"procs": [(100, 1024**3)]}] * 4)), node,
                                Pool(name="p", gpu_model="H100"), TopologyLabels(), 1.0,
                                assigned=lambda: assignments.latest)  # fmt: skip
            (batch,) = source.sample(1.0, {})
            assert [(g.uuid, g.job_id, g.pod) for g in batch.gpus] == [
                ("GPU-fake-0", "k8s-llm", "ml/llm-0"), ("GPU-fake-1", "k8s-llm", "ml/llm-0"),
                ("GPU-fake-2", "", ""), ("GPU-fake-3", "", "lab/notebook"),
            ]  # fmt: skip
            assert batch.gpus[0].processes is not None
            assert batch.gpus[0].processes[0].job_id == "k8s-llm", "its processes are the job's"
            assert (batch.gpus[0].unallocated_processes, batch.gpus[3].unallocated_processes) == (0, 1)
            assert batch.assignment_mismatches == []

            fake.pods[("ml", "llm-0")] = {"trainer": UUIDS[:1]}  # the kubelet gave it one GPU, the ledger booked 2
            mismatch = f"job k8s-llm: the ledger booked 2 GPU(s) on {node}, the kubelet gave its pods here 1"
            assert (await assignments.refresh()).mismatches == (mismatch,)
            second = source.sample(2.0, {})[0]
            assert second.assignment_mismatches == [mismatch]
            metrics = FleetMetrics()
            metrics.ingest(second, encode(second))
            families = {f.name: f for f in ChamberCollector(metrics, lambda n, i: "H100", lambda: None).collect()}
            (util,) = [m for m in families["DCGM_FI_DEV_GPU_UTIL"].samples if m.labels["UUID"] == "GPU-fake-0"]
            assert (util.labels["namespace"], util.labels["pod"], util.labels["chamber_job"]) == (
                "ml", "llm-0", "k8s-llm",
            ), "/metrics names the pod and the job, as dcgm-exporter names the pod"  # fmt: skip
            assert [m.value for m in families["chamber_gpu_assignment_mismatches"].samples] == [1.0]
            stop.set()
            await task
        await kc.close()
