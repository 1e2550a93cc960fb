"""Chamber on (emulated) Kubernetes, end to end on real NATS and Redis, with Jobs made by the official client:
webhooks suspend and vet them, the intake submits them, the scheduler places them, the Kubernetes executor
unsuspends and binds, the emulated kubelets run them; preemption suspends and resumes; a quarantined node is
cordoned, tainted and drained; the watcher survives a 410 and a restart."""

import asyncio
import urllib.request
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import msgspec
import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from chamber.cli.infra import free_port
from chamber.cli.kubesim.serve import Running, emulated_cluster
from chamber.collector import service as collector
from chamber.common.bus import Bus
from chamber.common.codec import Decoder
from chamber.common.contracts import (
    HealthCommand,
    JobEvent,
    JobLaunchFailed,
    JobRecord,
    NodeTelemetry,
    TeamConfig,
    TelemetryWire,
    as_telemetry,
)
from chamber.common.jobstore import JobStore
from chamber.common.kube.client import (
    CLUSTERTRAININGRUNTIMES,
    JOBSETS,
    NODES,
    PODS,
    PYTORCHJOBS,
    TRAININGRUNTIMES,
    TRAINJOBS,
    KubeClient,
)
from chamber.common.kube.errors import KubeError
from chamber.common.quotastore import QuotaStore
from chamber.common.settings import Settings
from chamber.gateway import service as gateway
from chamber.health import service as health
from chamber.scheduler import service as scheduler
from tests.support.kube import call, gpu_job, official, training_runtime, trainjob
from tests.support.kubelet import kubelet, short_socket_dir
from tests.support.services import eventually, running

pytestmark = pytest.mark.integration


@pytest.fixture
async def kube(settings: Settings, cleanup: None) -> AsyncIterator[tuple[Settings, Running]]:
    hook_port = free_port()
    async with emulated_cluster(
        settings, webhook_url=f"http://127.0.0.1:{hook_port}", tick_s=0.05, grace_cap_s=0.5, bookmark_interval_s=0.5
    ) as run:
        s = msgspec.structs.replace(
            settings, kube_api=run.url, executor="kubernetes", inventory_source="kubernetes",
            kube_webhook_port=hook_port, http_port=0, kube_start_timeout_s=30.0,
        )  # fmt: skip
        yield s, run


async def webhooks_up(settings: Settings) -> None:
    """Wait for the gateway's webhooks (the API server calls them on every Job creation; failurePolicy Fail)."""

    def answers() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{settings.kube_webhook_port}/healthz", timeout=1) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    await eventually(lambda: asyncio.to_thread(answers), within=15, what="the webhooks answer")


SERVICES = (("collector", collector.main), ("scheduler", scheduler.main), ("gateway", gateway.main))


async def record(store: JobStore, job_id: str) -> JobRecord | None:
    got = await store.get(job_id)
    return None if got is None else got[0]


async def state_of(store: JobStore, job_id: str) -> str:
    r = await record(store, job_id)
    return "" if r is None else str(r.state)


async def test_a_labelled_job_is_suspended_admitted_bound_run_and_finished(
    kube: tuple[Settings, Running], bus: Bus
) -> None:
    settings, cluster = kube
    batch, core = client.BatchV1Api(official(cluster.url)), client.CoreV1Api(official(cluster.url))
    store = await JobStore.open(bus)
    async with running(settings, *SERVICES):
        await webhooks_up(settings)
        created = await call(batch.create_namespaced_job, "default", gpu_job("llama", replicas=2, gpus=4, seconds=1))
        assert created.spec.suspend is True, "the mutating webhook suspended it on creation"
        assert created.spec.template.spec.scheduler_name == "chamber"
        assert created.metadata.labels["chamber.io/managed"] == "true"
        job_id = f"k8s-{created.metadata.uid}"
        await eventually(lambda: state_of(store, job_id), within=15, what="the intake submitted it")
        await eventually(lambda: _is(store, job_id, "succeeded"), within=20, what="it ran to completion")
        done = await record(store, job_id)
        assert done is not None
        assert done.placement is not None
        assert done.spec.workload is not None
        assert done.spec.workload.name == "llama"
        pods = (
            await call(core.list_namespaced_pod, "default", label_selector="batch.kubernetes.io/job-name=llama")
        ).items
        by_index = {int(p.metadata.labels["batch.kubernetes.io/job-completion-index"]): p for p in pods}
        placed = [done.placement.gpus[r * 4].node for r in range(2)]
        assert [by_index[r].spec.node_name for r in range(2)] == placed, "each replica bound where the ledger said"
        assert all(p.metadata.annotations["chamber.io/attempt"] == "1" for p in pods)
        finished = await call(batch.read_namespaced_job, "llama", "default")
        assert any(c.type == "Complete" and c.status == "True" for c in finished.status.conditions)

        # Kueue's queue label is honoured as the team; a Job too big to fit waits with no pods, and deleting
        # it cancels it.
        big = gpu_job("huge", replicas=5, gpus=8, team_label="kueue.x-k8s.io/queue-name", team="vision")
        huge = await call(batch.create_namespaced_job, "default", big)
        huge_id = f"k8s-{huge.metadata.uid}"
        await eventually(lambda: state_of(store, huge_id), within=15, what="the Kueue-labelled Job submitted")
        waiting = await record(store, huge_id)
        assert waiting is not None
        assert waiting.spec.team == "vision"
        assert waiting.state == "pending"
        pods = await call(core.list_namespaced_pod, "default", label_selector="batch.kubernetes.io/job-name=huge")
        assert pods.items == [], "no pod exists while it waits"
        await call(batch.delete_namespaced_job, "huge", "default")
        await eventually(lambda: _is(store, huge_id, "cancelled"), within=15, what="deleting the Job cancelled it")


async def _is(store: JobStore, job_id: str, state: str) -> bool:
    return await state_of(store, job_id) == state


async def test_a_higher_priority_job_preempts_by_suspending_and_the_victim_resumes(
    kube: tuple[Settings, Running], bus: Bus
) -> None:
    settings, cluster = kube
    batch, core = client.BatchV1Api(official(cluster.url)), client.CoreV1Api(official(cluster.url))
    store = await JobStore.open(bus)
    async with running(settings, *SERVICES):
        await webhooks_up(settings)
        sweep = gpu_job("sweep", replicas=4, gpus=8, seconds=4, priority="research", grace_s=1)
        victim = await call(batch.create_namespaced_job, "default", sweep)
        victim_id = f"k8s-{victim.metadata.uid}"
        await eventually(lambda: _is(store, victim_id, "running"), within=20, what="the sweep fills the fleet")
        urgent = await call(batch.create_namespaced_job, "default", gpu_job("urgent", gpus=8, seconds=1))
        urgent_id = f"k8s-{urgent.metadata.uid}"
        await eventually(lambda: _is(store, victim_id, "preempted"), within=20, what="the sweep preempted")
        suspended = await call(batch.read_namespaced_job, "sweep", "default")
        assert suspended.spec.suspend is True, "preemption suspends the Job"
        await eventually(lambda: _is(store, urgent_id, "succeeded"), within=20, what="the urgent job ran")
        await eventually(lambda: _is(store, victim_id, "succeeded"), within=30, what="the sweep resumed and finished")
        done = await record(store, victim_id)
        assert done is not None
        assert done.preemptions == 1
        assert done.attempt == 2
        pods = (
            await call(core.list_namespaced_pod, "default", label_selector="batch.kubernetes.io/job-name=sweep")
        ).items
        assert {p.metadata.annotations["chamber.io/attempt"] for p in pods} == {"2"}, "the resumed attempt's pods"


async def test_a_quarantined_node_is_cordoned_tainted_and_drained_then_released(
    kube: tuple[Settings, Running], bus: Bus
) -> None:
    settings, cluster = kube
    batch = client.BatchV1Api(official(cluster.url))
    kc = KubeClient.connect(cluster.url)
    store = await JobStore.open(bus)
    async with running(settings, *SERVICES, ("health", health.main)):
        await webhooks_up(settings)
        job = await call(batch.create_namespaced_job, "default", gpu_job("pretrain", gpus=8, seconds=60))
        job_id = f"k8s-{job.metadata.uid}"
        await eventually(lambda: _is(store, job_id, "running"), within=20, what="pretrain running")
        first = await record(store, job_id)
        assert first is not None
        assert first.placement is not None
        bad = first.placement.gpus[0].node
        # a pod of someone else's on the same node, and one protected by a disruption budget
        for name in ("bystander", "protected"):
            await kc.create(PODS, {"metadata": {"name": name, "labels": {"app": name}},
                                   "spec": {"containers": [{"name": "c", "image": "x"}]}}, "default")  # fmt: skip
            await kc.bind("default", name, bad)
        pdb = {"metadata": {"name": "protected"},
               "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "protected"}}}}  # fmt: skip
        await kc.request("POST", "/apis/policy/v1/namespaces/default/poddisruptionbudgets", body=pdb)
        await eventually(lambda: _phase(kc, "protected", "Running"), what="the protected pod runs")
        command = HealthCommand(node=bad, gpu_index=None, command="cordon", reason="bad board")
        await bus.publish(bus.names.health_command(bad), command)

        async def quarantined() -> bool:
            node = await kc.get(NODES, bad)
            taints = node["spec"].get("taints") or []
            return bool(node["spec"].get("unschedulable")) and any(
                t["key"] == "chamber.io/gpu-unhealthy" for t in taints
            )

        await eventually(quarantined, within=15, what="the node cordoned and tainted")
        await eventually(lambda: _gone(kc, "bystander"), within=15, what="the bystander evicted")
        assert await _phase(kc, "protected", "Running"), "the disruption budget kept its pod"

        async def moved() -> bool:
            r = await record(store, job_id)
            return (
                r is not None and r.state == "running" and r.placement is not None and r.placement.gpus[0].node != bad
            )

        await eventually(moved, within=30, what="pretrain resumed on another node")
        await bus.publish(bus.names.health_command(bad), HealthCommand(node=bad, gpu_index=None, command="release"))

        async def released() -> bool:
            node = await kc.get(NODES, bad)
            return not node["spec"].get("unschedulable") and not node["spec"].get("taints")

        await eventually(released, within=15, what="untainted and uncordoned")
    await kc.close()


async def _phase(kc: KubeClient, name: str, phase: str) -> bool:
    return bool((await kc.get(PODS, name, "default")).get("status", {}).get("phase") == phase)


async def _gone(kc: KubeClient, name: str) -> bool:
    pods, _ = await kc.list(PODS, "default", fields=f"metadata.name={name}")
    return not pods or bool(pods[0]["metadata"].get("deletionTimestamp"))


async def test_the_webhooks_reject_what_chamber_cannot_run_and_ignore_unlabelled_jobs(
    kube: tuple[Settings, Running], bus: Bus
) -> None:
    settings, cluster = kube
    batch = client.BatchV1Api(official(cluster.url))
    async with running(settings, ("gateway", gateway.main)):
        await webhooks_up(settings)
        cases = {
            "no-gpus": (gpu_job("no-gpus", gpus=0), "asks for no nvidia.com/gpu"),
            "not-indexed": (_without_indexed(gpu_job("gang", replicas=2, gpus=4)), "completionMode: Indexed"),
            "bad-priority": (gpu_job("vip", priority="urgent"), "chamber.io/priority='urgent' is unknown"),
        }
        for name, (body, message) in cases.items():
            with pytest.raises(ApiException) as exc:
                await call(batch.create_namespaced_job, "default", body)
            assert exc.value.status == 400, name
            said = str(exc.value.body)  # what kubectl prints: `admission webhook "..." denied the request: ...`
            assert "denied the request" in said, (name, said)
            assert message in said, (name, said)
        # A team that takes workloads only from its own namespaces: the webhook follows the quota store.
        quota = await QuotaStore.open(bus)
        config, revision = await quota.get()
        await quota.put(msgspec.structs.replace(config, teams=[
            TeamConfig(name="nlp", org="research", namespaces=["nlp"]),
        ]), revision)  # fmt: skip

        async def refused_in_default() -> bool:
            try:
                made = await call(batch.create_namespaced_job, "default", gpu_job("borrowed-name"))
            except ApiException as exc:
                return exc.status == 400 and "takes workloads only from namespace nlp, not default" in str(exc.body)
            await call(batch.delete_namespaced_job, made.metadata.name, "default")
            return False

        await eventually(refused_in_default, within=10, what="a Job naming team nlp from namespace default refused")
        ours = await call(batch.create_namespaced_job, "nlp", gpu_job("own-name"))
        assert ours.spec.suspend is True, "its own namespace's Job is taken"
        plain = gpu_job("plain")
        del plain["metadata"]["labels"]["chamber.io/team"]
        untouched = await call(batch.create_namespaced_job, "default", plain)
        assert untouched.spec.suspend is False
        assert untouched.spec.template.spec.scheduler_name == "default-scheduler"


def _without_indexed(job: dict[str, object]) -> dict[str, object]:
    del job["spec"]["completionMode"]  # type: ignore[attr-defined]
    return job


async def test_the_watcher_survives_a_410_and_a_restart(kube: tuple[Settings, Running], bus: Bus) -> None:
    settings, cluster = kube
    batch = client.BatchV1Api(official(cluster.url))
    store = await JobStore.open(bus)
    async with running(settings, ("collector", collector.main), ("scheduler", scheduler.main)):
        async with running(settings, ("gateway", gateway.main)):
            await webhooks_up(settings)
            waits = await call(batch.create_namespaced_job, "default", gpu_job("waits", replicas=5, gpus=8))
            waits_id = f"k8s-{waits.metadata.uid}"
            await eventually(lambda: _is(store, waits_id, "pending"), within=15, what="submitted and waiting")
        await call(batch.delete_namespaced_job, "waits", "default")  # while the gateway is down
        async with running(settings, ("gateway", gateway.main)):
            await webhooks_up(settings)
            await eventually(lambda: _is(store, waits_id, "cancelled"), within=15, what="cancelled after the restart")
            after = await call(batch.create_namespaced_job, "default", gpu_job("after", replicas=5, gpus=8))
            after_id = f"k8s-{after.metadata.uid}"
            await eventually(lambda: _is(store, after_id, "pending"), within=15, what="watching after the restart")
            cluster.api.drop_watches()  # the watch breaks while history is compacted: resuming gets 410
            cluster.api.compact()
            await call(batch.delete_namespaced_job, "after", "default")
            cluster.api.compact()
            await eventually(lambda: _is(store, after_id, "cancelled"), within=15, what="the deletion seen by a relist")
            late = await call(batch.create_namespaced_job, "default", gpu_job("late", gpus=8, seconds=0.5))
            await eventually(
                lambda: _is(store, f"k8s-{late.metadata.uid}", "succeeded"), within=20, what="still watching"
            )


async def test_a_launch_whose_pods_do_not_run_in_time_is_undone_and_requeued(
    kube: tuple[Settings, Running], bus: Bus
) -> None:
    settings, cluster = kube
    settings = msgspec.structs.replace(settings, kube_start_timeout_s=1.5)
    batch = client.BatchV1Api(official(cluster.url))
    store = await JobStore.open(bus)
    failures: list[JobLaunchFailed] = []
    decoder = Decoder(JobEvent)

    async def on_lifecycle(msg: Any) -> None:
        event = decoder.decode(msg.data)
        if isinstance(event, JobLaunchFailed):
            failures.append(event)

    await bus.nc.subscribe(bus.names.subject("jobs.lifecycle.>"), cb=on_lifecycle)
    async with running(settings, *SERVICES):
        await webhooks_up(settings)
        cluster.cluster.kubelets_paused = True  # bound pods never start
        job = await call(batch.create_namespaced_job, "default", gpu_job("stuck", gpus=8, seconds=0.5))
        job_id = f"k8s-{job.metadata.uid}"

        async def failed_once() -> bool:
            r = await record(store, job_id)
            return r is not None and r.launch_failures >= 1

        await eventually(failed_once, within=20, what="the launch undone after the start deadline")
        cluster.cluster.kubelets_paused = False
        assert failures, "the executor reported the failed launch"
        assert "not running within 1.5 s" in failures[0].reason, failures[0].reason
        assert "Pending on node-" in failures[0].reason, "the reason names the pods still pending"
        await eventually(lambda: _is(store, job_id, "succeeded"), within=20, what="a later launch ran")


async def test_nodes_joining_and_leaving_update_the_inventory(kube: tuple[Settings, Running], bus: Bus) -> None:
    from chamber.cli.kubesim.cluster import node_objects
    from chamber.collector.core.simfleet import FleetShape
    from chamber.common.contracts import NodeInventory
    from chamber.common.subjects import INVENTORY

    settings, cluster = kube

    async def gpus_of(node: str) -> int | None:
        found = await bus.read_latest(INVENTORY, bus.names.inventory(node), Decoder(NodeInventory))
        return len(found[-1].node.gpus) if found else None

    async with running(settings, ("collector", collector.main)):
        await eventually(lambda: _equals(gpus_of("node-0003"), 8), what="the emulated nodes discovered")
        newcomer = node_objects(FleetShape(nodes=5, gpus_per_node=4, gpu_model="L40S"))[4]
        newcomer["metadata"]["labels"]["chamber.io/pool"] = "l40s"
        cluster.api.create("/v1/nodes", newcomer)
        await eventually(lambda: _equals(gpus_of("node-0004"), 4), what="a joining node appears")
        joined = (await bus.read_latest(INVENTORY, bus.names.inventory("node-0004"), Decoder(NodeInventory)))[-1]
        assert (joined.pool.name, joined.pool.gpu_model, joined.node.cluster) == ("l40s", "L40S", "local")
        cluster.api.remove("/v1/nodes", "", "node-0004")
        await eventually(lambda: _equals(gpus_of("node-0004"), 0), what="a leaving node has no GPUs left")


async def _equals(value: Awaitable[object], expected: object) -> bool:
    return await value == expected


async def test_an_oom_killed_job_fails_with_its_exit_code(kube: tuple[Settings, Running], bus: Bus) -> None:
    settings, cluster = kube
    batch = client.BatchV1Api(official(cluster.url))
    store = await JobStore.open(bus)
    async with running(settings, *SERVICES):
        await webhooks_up(settings)
        body = gpu_job("oom", gpus=8, seconds=0.3, annotations={"chamber.io/sim-exit-code": "137"})
        job = await call(batch.create_namespaced_job, "default", body)
        job_id = f"k8s-{job.metadata.uid}"
        await eventually(lambda: _is(store, job_id, "failed"), within=20, what="the job failed")
        failed = await record(store, job_id)
        assert failed is not None
        assert failed.reason.startswith("failed: OOMKilled"), failed.reason
        assert "exit code 137" in failed.reason, failed.reason


def jobset(name: str, groups: dict[str, tuple[int, int]], *, gpus: int, seconds: float) -> dict[str, Any]:
    """A JobSet of replicated Jobs: name -> (child Jobs, pods per child Job)."""
    rjobs = []
    for rjob, (replicas, parallelism) in groups.items():
        job = gpu_job(rjob, replicas=parallelism, gpus=gpus)
        rjobs.append({"name": rjob, "replicas": replicas, "template": {"spec": job["spec"]}})
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
        "metadata": {"name": name, "labels": {"chamber.io/team": "nlp"},
                     "annotations": {"chamber.io/sim-duration-s": str(seconds)}},
        "spec": {"replicatedJobs": rjobs},
    }  # fmt: skip


async def test_a_jobset_runs_as_one_gang_bound_replica_by_replica(kube: tuple[Settings, Running], bus: Bus) -> None:
    settings, cluster = kube
    kc = KubeClient.connect(cluster.url)
    store = await JobStore.open(bus)
    async with running(settings, *SERVICES):
        await webhooks_up(settings)
        body = jobset("pretrain", {"driver": (1, 1), "workers": (2, 1)}, gpus=8, seconds=1)
        created = await kc.request("POST", "/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets", body=body)
        assert created["spec"]["suspend"] is True, "the webhook suspended the JobSet"
        job_id = f"k8s-{created['metadata']['uid']}"
        await eventually(lambda: _is(store, job_id, "succeeded"), within=30, what="the JobSet ran as one gang")
        done = await record(store, job_id)
        assert done is not None
        assert done.placement is not None
        assert (done.spec.replicas, done.spec.gpus_per_replica) == (3, 8)
        pods, _ = await kc.list(PODS, "default", labels="jobset.sigs.k8s.io/jobset-name=pretrain")
        labels = [p["metadata"]["labels"] for p in pods]
        keys = [(lab["jobset.sigs.k8s.io/replicatedjob-name"], lab["jobset.sigs.k8s.io/job-index"]) for lab in labels]
        where = dict(zip(keys, [p["spec"]["nodeName"] for p in pods], strict=True))
        placed = [done.placement.gpus[r * 8].node for r in range(3)]
        assert where == {("driver", "0"): placed[0], ("workers", "0"): placed[1], ("workers", "1"): placed[2]}
    await kc.close()


def pytorchjob(name: str, workers: int, *, gpus: int, seconds: float) -> dict[str, Any]:
    """A PyTorchJob of one Master and `workers` Workers, each pod asking for `gpus`."""

    def replica(replicas: int) -> dict[str, Any]:
        template = gpu_job(name, gpus=gpus)["spec"]["template"]
        return {"replicas": replicas, "restartPolicy": "OnFailure", "template": template}

    return {
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
        "metadata": {"name": name, "labels": {"chamber.io/team": "nlp"},
                     "annotations": {"chamber.io/sim-duration-s": str(seconds)}},
        "spec": {"pytorchReplicaSpecs": {"Master": replica(1), "Worker": replica(workers)}},
    }  # fmt: skip


async def test_a_pytorchjob_runs_as_one_gang_master_first_bound_replica_by_replica(
    kube: tuple[Settings, Running], bus: Bus
) -> None:
    settings, cluster = kube
    kc = KubeClient.connect(cluster.url)
    store = await JobStore.open(bus)
    async with running(settings, *SERVICES):
        await webhooks_up(settings)
        body = pytorchjob("ddp", 2, gpus=8, seconds=1)
        created = await kc.request("POST", "/apis/kubeflow.org/v1/namespaces/default/pytorchjobs", body=body)
        assert created["spec"]["runPolicy"]["suspend"] is True, "the webhook suspended the PyTorchJob"
        assert "suspend" not in created["spec"]
        templates = created["spec"]["pytorchReplicaSpecs"].values()
        assert {t["template"]["spec"]["schedulerName"] for t in templates} == {"chamber"}
        job_id = f"k8s-{created['metadata']['uid']}"
        await eventually(lambda: _is(store, job_id, "succeeded"), within=30, what="the PyTorchJob ran as one gang")
        done = await record(store, job_id)
        assert done is not None
        assert done.placement is not None
        assert (done.spec.replicas, done.spec.gpus_per_replica) == (3, 8)
        assert done.spec.workload is not None
        assert done.spec.workload.kind == "PyTorchJob"
        pods, _ = await kc.list(PODS, "default", labels="training.kubeflow.org/job-name=ddp")
        labels = [p["metadata"]["labels"] for p in pods]
        keys = [
            (lab["training.kubeflow.org/replica-type"], lab["training.kubeflow.org/replica-index"]) for lab in labels
        ]
        assert all(lab["chamber.io/job-id"] == job_id for lab in labels), "the attempt is on every replica's pods"
        where = dict(zip(keys, [p["spec"]["nodeName"] for p in pods], strict=True))
        placed = [done.placement.gpus[r * 8].node for r in range(3)]
        assert where == {("master", "0"): placed[0], ("worker", "0"): placed[1], ("worker", "1"): placed[2]}
        finished = await kc.get(PYTORCHJOBS, "ddp", "default")
        assert finished["spec"]["runPolicy"]["suspend"] is False, "the executor resumed it through runPolicy"
    await kc.close()


async def test_a_rejected_pytorchjob_is_refused_by_the_webhook(kube: tuple[Settings, Running], bus: Bus) -> None:
    settings, cluster = kube
    kc = KubeClient.connect(cluster.url)
    async with running(settings, ("gateway", gateway.main)):
        await webhooks_up(settings)
        body = pytorchjob("uneven", 1, gpus=8, seconds=1)
        body["spec"]["pytorchReplicaSpecs"]["Master"]["template"] = gpu_job("m", gpus=4)["spec"]["template"]
        with pytest.raises(KubeError, match="same number of GPUs"):
            await kc.request("POST", "/apis/kubeflow.org/v1/namespaces/default/pytorchjobs", body=body)
    await kc.close()


async def test_a_preempted_pytorchjob_is_suspended_through_its_run_policy_and_resumes(
    kube: tuple[Settings, Running], bus: Bus
) -> None:
    settings, cluster = kube
    batch = client.BatchV1Api(official(cluster.url))
    kc = KubeClient.connect(cluster.url)
    store = await JobStore.open(bus)
    async with running(settings, *SERVICES):
        await webhooks_up(settings)
        body = pytorchjob("sweep", 3, gpus=8, seconds=4)
        body["metadata"]["labels"]["chamber.io/priority"] = "research"
        created = await kc.request("POST", "/apis/kubeflow.org/v1/namespaces/default/pytorchjobs", body=body)
        victim_id = f"k8s-{created['metadata']['uid']}"
        await eventually(lambda: _is(store, victim_id, "running"), within=20, what="the PyTorchJob fills the fleet")
        urgent = await call(batch.create_namespaced_job, "default", gpu_job("urgent", gpus=8, seconds=1))
        urgent_id = f"k8s-{urgent.metadata.uid}"
        await eventually(lambda: _is(store, victim_id, "preempted"), within=20, what="the PyTorchJob preempted")
        suspended = await kc.get(PYTORCHJOBS, "sweep", "default")
        assert suspended["spec"]["runPolicy"]["suspend"] is True, "preemption suspends it through spec.runPolicy"
        await eventually(lambda: _is(store, urgent_id, "succeeded"), within=20, what="the urgent job ran")
        await eventually(lambda: _is(store, victim_id, "succeeded"), within=30, what="it resumed and finished")
        done = await record(store, victim_id)
        assert done is not None
        assert (done.preemptions, done.attempt) == (1, 2)
        pods, _ = await kc.list(PODS, "default", labels="training.kubeflow.org/job-name=sweep")
        assert {p["metadata"]["annotations"]["chamber.io/attempt"] for p in pods} == {"2"}, "the resumed attempt's"
    await kc.close()


TRAINER = ("trainer.kubeflow.org", "v1alpha1")


async def create_trainjob(custom: client.CustomObjectsApi, body: dict[str, Any]) -> dict[str, Any]:
    created: dict[str, Any] = await call(custom.create_namespaced_custom_object, *TRAINER, "default", "trainjobs", body)
    return created


async def test_a_trainjob_is_suspended_admitted_its_trainer_pods_bound_to_the_reserved_nodes_and_finished(
    kube: tuple[Settings, Running], bus: Bus
) -> None:
    settings, cluster = kube
    custom = client.CustomObjectsApi(official(cluster.url))
    kc = KubeClient.connect(cluster.url)
    store = await JobStore.open(bus)
    await kc.create(CLUSTERTRAININGRUNTIMES, training_runtime(gpus=4, nodes=1, initializer=False))
    async with running(settings, *SERVICES):
        await webhooks_up(settings)
        created = await create_trainjob(custom, trainjob("finetune", nodes=2, gpus=8, seconds=1))
        assert created["spec"]["suspend"] is True, "the mutating webhook suspended the TrainJob on creation"
        assert created["metadata"]["labels"]["chamber.io/managed"] == "true"
        job_id = f"k8s-{created['metadata']['uid']}"
        await eventually(lambda: _is(store, job_id, "succeeded"), within=30, what="the TrainJob ran as one gang")
        done = await record(store, job_id)
        assert done is not None
        assert done.placement is not None
        assert (done.spec.replicas, done.spec.gpus_per_replica) == (2, 8), "numNodes x resourcesPerNode"
        assert done.spec.workload is not None
        assert (done.spec.workload.kind, done.spec.workload.name) == ("TrainJob", "finetune")
        pods, _ = await kc.list(PODS, "default", labels="jobset.sigs.k8s.io/jobset-name=finetune")
        assert len(pods) == 2
        assert all(p["metadata"]["labels"]["chamber.io/job-id"] == job_id for p in pods)
        where = {int(p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"]): p["spec"]["nodeName"]
                 for p in pods}  # fmt: skip
        assert where == {r: done.placement.gpus[r * 8].node for r in range(2)}, "bound where the ledger reserved"
        assert {p["spec"]["schedulerName"] for p in pods} == {"chamber"}, "the runtime made them Chamber's"
        finished = await kc.get(TRAINJOBS, "finetune", "default")
        assert finished["spec"]["suspend"] is False, "the executor resumed it"
        assert any(c["type"] == "Complete" and c["status"] == "True" for c in finished["status"]["conditions"])
    await kc.close()


async def test_a_trainjob_chamber_cannot_run_is_refused_by_the_webhook(
    kube: tuple[Settings, Running], bus: Bus
) -> None:
    settings, cluster = kube
    custom = client.CustomObjectsApi(official(cluster.url))
    kc = KubeClient.connect(cluster.url)
    await kc.create(CLUSTERTRAININGRUNTIMES, training_runtime("torch-default", scheduler=None, initializer=False))
    greedy = training_runtime("greedy-init", kind="TrainingRuntime")
    greedy["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0][
        "resources"
    ] = {"limits": {"nvidia.com/gpu": "1"}}
    await kc.create(TRAININGRUNTIMES, greedy, "default")
    async with running(settings, ("gateway", gateway.main)):
        await webhooks_up(settings)
        with pytest.raises(ApiException, match="must say schedulerName: chamber"):
            await create_trainjob(custom, trainjob("elsewhere", runtime="torch-default", gpus=8))
        with pytest.raises(ApiException, match="does not exist"):
            await create_trainjob(custom, trainjob("nowhere", runtime="no-such-runtime", gpus=8))
        with pytest.raises(ApiException, match="GPUs for the trainer's nodes only"):
            await create_trainjob(custom, trainjob("greedy", runtime="greedy-init", runtime_kind="TrainingRuntime"))
    await kc.close()


async def test_a_preempted_trainjob_is_suspended_and_resumes_on_its_jobset(
    kube: tuple[Settings, Running], bus: Bus
) -> None:
    settings, cluster = kube
    batch = client.BatchV1Api(official(cluster.url))
    custom = client.CustomObjectsApi(official(cluster.url))
    kc = KubeClient.connect(cluster.url)
    store = await JobStore.open(bus)
    await kc.create(CLUSTERTRAININGRUNTIMES, training_runtime(gpus=8, nodes=4, initializer=False))
    async with running(settings, *SERVICES):
        await webhooks_up(settings)
        created = await create_trainjob(custom, trainjob("sweep", seconds=4, priority="research"))
        victim_id = f"k8s-{created['metadata']['uid']}"
        await eventually(lambda: _is(store, victim_id, "running"), within=20, what="the TrainJob fills the fleet")
        urgent = await call(batch.create_namespaced_job, "default", gpu_job("urgent", gpus=8, seconds=1))
        urgent_id = f"k8s-{urgent.metadata.uid}"
        await eventually(lambda: _is(store, victim_id, "preempted"), within=20, what="the TrainJob preempted")
        suspended = await kc.get(TRAINJOBS, "sweep", "default")
        assert suspended["spec"]["suspend"] is True, "preemption suspends the TrainJob (spec.suspend)"
        await eventually(lambda: _is(store, urgent_id, "succeeded"), within=20, what="the urgent job ran")
        await eventually(lambda: _is(store, victim_id, "succeeded"), within=30, what="it resumed and finished")
        done = await record(store, victim_id)
        assert done is not None
        assert (done.preemptions, done.attempt) == (1, 2)
        pods, _ = await kc.list(PODS, "default", labels="jobset.sigs.k8s.io/jobset-name=sweep")
        assert {p["metadata"]["annotations"]["chamber.io/attempt"] for p in pods} == {"2"}, "the resumed attempt's"
        jobset = await kc.get(JOBSETS, "sweep", "default")
        assert jobset["metadata"]["ownerReferences"][0]["uid"] == created["metadata"]["uid"]
    await kc.close()


async def test_the_node_agent_names_the_job_the_kubelet_gave_each_gpu_to(
    kube: tuple[Settings, Running], bus: Bus
) -> None:
    """A Job runs through Chamber on the emulator; a node agent (fake NVML, a kubelet's PodResources socket that
    gives the Job's pod the node's two GPUs) publishes telemetry naming that job on each GPU."""
    settings, cluster = kube
    batch = client.BatchV1Api(official(cluster.url))
    store = await JobStore.open(bus)
    seen: list[NodeTelemetry] = []
    decoder = Decoder(TelemetryWire)
    with short_socket_dir() as sock_dir:
        async with running(settings, *SERVICES):
            await webhooks_up(settings)
            created = await call(batch.create_namespaced_job, "default", gpu_job("probe", gpus=2, seconds=30))
            job_id = f"k8s-{created.metadata.uid}"
            await eventually(lambda: _is(store, job_id, "running"), within=20, what="the Job runs")
            kc = KubeClient.connect(cluster.url)
            (pod,), _ = await kc.list(PODS, "default", labels="batch.kubernetes.io/job-name=probe")
            node = pod["spec"]["nodeName"]
            gpus = {("default", pod["metadata"]["name"]): {"main": ["GPU-fake-0", "GPU-fake-1"]}}
            async with kubelet(sock_dir / "kubelet.sock", gpus, ["GPU-fake-0", "GPU-fake-1"]):
                agent = msgspec.structs.replace(
                    settings, collector_role="agent", nvml_module="tests.support.fakenvml:TWO_H100", node_name=node,
                    pod_resources_socket=str(sock_dir / "kubelet.sock"), telemetry_interval_s=0.2,
                )  # fmt: skip

                async def on_msg(msg: Any) -> None:
                    event = as_telemetry(decoder.decode(msg.data))
                    if isinstance(event, NodeTelemetry) and event.source == "nvml":
                        seen.append(event)

                sub = await bus.nc.subscribe(bus.names.telemetry(node), cb=on_msg)
                async with running(agent, ("agent", collector.main)):
                    await eventually(lambda: any(g.job_id for b in seen for g in b.gpus), within=15,
                                     what="the agent's telemetry names the job")  # fmt: skip
                await sub.unsubscribe()
            await kc.close()
    named = next(b for b in seen if any(g.job_id for g in b.gpus))
    assert [(g.uuid, g.job_id) for g in named.gpus] == [("GPU-fake-0", job_id), ("GPU-fake-1", job_id)]
    assert named.assignment_mismatches == [], "the kubelet gave the pod the 2 GPUs the ledger booked here"
