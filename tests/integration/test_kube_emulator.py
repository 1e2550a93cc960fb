"""The emulated Kubernetes API server, driven by the official `kubernetes` client: what kmock 0.8 lacked and
Chamber relies on (identity fields, selectors, PUT, binding, eviction with budgets, watches that resume and
expire, strategic merge, discovery), and the reflector surviving a 410."""

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from chamber.cli.kubesim.serve import Running, emulated_cluster
from chamber.common.kube.client import NODES, PODS, KubeClient
from chamber.common.kube.errors import KubeConflict, KubeTooManyRequests
from chamber.common.kube.watch import Reflector
from chamber.common.settings import Settings
from tests.support.kube import call, official
from tests.support.services import eventually


@pytest.fixture
async def cluster() -> AsyncIterator[Running]:
    async with emulated_cluster(Settings(fleet_nodes=2, gpus_per_node=8), tick_s=0.05, bookmark_interval_s=0.2) as run:
        yield run


def pod(name: str = "", *, labels: dict[str, str] | None = None, generate: str = "") -> dict[str, object]:
    meta: dict[str, object] = {"labels": labels or {}}
    if name:
        meta["name"] = name
    if generate:
        meta["generateName"] = generate
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"containers": [{"name": "c", "image": "busybox"}], "schedulerName": "chamber"}}  # fmt: skip


async def test_objects_get_identity_and_generated_names(cluster: Running) -> None:
    core = client.CoreV1Api(official(cluster.url))
    a = await call(core.create_namespaced_pod, "default", pod(generate="worker-"))
    b = await call(core.create_namespaced_pod, "default", pod(generate="worker-"))
    assert a.metadata.name.startswith("worker-")
    assert a.metadata.name != b.metadata.name
    assert a.metadata.uid
    assert a.metadata.uid != b.metadata.uid
    assert int(b.metadata.resource_version) > int(a.metadata.resource_version)
    assert a.metadata.creation_timestamp is not None
    with pytest.raises(ApiException) as exc:
        await call(core.create_namespaced_pod, "default", pod(a.metadata.name))
    assert exc.value.status == 409


async def test_label_and_field_selectors_filter_lists(cluster: Running) -> None:
    core = client.CoreV1Api(official(cluster.url))
    await call(core.create_namespaced_pod, "default", pod("a", labels={"team": "nlp", "tier": "gpu"}))
    await call(core.create_namespaced_pod, "default", pod("b", labels={"team": "vision"}))

    def names(pods: Any) -> list[str]:
        return sorted(p.metadata.name for p in pods.items)

    assert names(await call(core.list_namespaced_pod, "default", label_selector="team=nlp")) == ["a"]
    assert names(await call(core.list_namespaced_pod, "default", label_selector="team in (nlp,vision),!tier")) == ["b"]
    assert names(await call(core.list_namespaced_pod, "default", label_selector="tier")) == ["a"]
    assert names(await call(core.list_namespaced_pod, "default", field_selector="metadata.name=b")) == ["b"]
    assert len((await call(client.CoreV1Api(official(cluster.url)).list_node)).items) == 2


async def test_binding_assigns_once_and_put_replaces_with_optimistic_concurrency(cluster: Running) -> None:
    kube = KubeClient.connect(cluster.url)
    core = client.CoreV1Api(official(cluster.url))
    created = await call(core.create_namespaced_pod, "default", pod("p"))
    await kube.bind("default", "p", "node-0000", created.metadata.uid)
    bound = await call(core.read_namespaced_pod, "p", "default")
    assert bound.spec.node_name == "node-0000"
    with pytest.raises(KubeConflict, match="already assigned"):
        await kube.bind("default", "p", "node-0001")
    stale = created.to_dict()
    stale["metadata"]["labels"] = {"x": "y"}
    with pytest.raises(ApiException) as exc:
        await call(core.replace_namespaced_pod, "p", "default", client.V1Pod.from_dict(stale))
    assert exc.value.status == 409, "a PUT with an old resourceVersion is a conflict"
    await kube.close()


async def test_eviction_honours_disruption_budgets(cluster: Running) -> None:
    kube = KubeClient.connect(cluster.url)
    core, policy = client.CoreV1Api(official(cluster.url)), client.PolicyV1Api(official(cluster.url))
    for name in ("w0", "w1"):
        await call(core.create_namespaced_pod, "default", pod(name, labels={"app": "serve"}))
        await kube.bind("default", name, "node-0000")

    async def all_running() -> bool:
        pods = await call(core.list_namespaced_pod, "default")
        return all(p.status.phase == "Running" for p in pods.items)

    await eventually(all_running, what="both pods running")
    pdb = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "serve"},
           "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "serve"}}}}  # fmt: skip
    await call(policy.create_namespaced_pod_disruption_budget, "default", pdb)
    with pytest.raises(KubeTooManyRequests, match="disruption budget"):
        await kube.evict("default", "w0")
    await call(policy.patch_namespaced_pod_disruption_budget, "serve", "default", {"spec": {"minAvailable": 1}})
    await kube.evict("default", "w0")
    evicted = await call(core.read_namespaced_pod, "w0", "default")
    assert evicted.metadata.deletion_timestamp is not None
    assert any(c.type == "DisruptionTarget" for c in evicted.status.conditions)
    await kube.close()


async def test_strategic_merge_replaces_taints_and_merges_containers(cluster: Running) -> None:
    core = client.CoreV1Api(official(cluster.url))
    await call(core.patch_node, "node-0000", {"spec": {"taints": [{"key": "a", "effect": "NoSchedule"}]}})
    await call(core.patch_node, "node-0000", {"spec": {"taints": [{"key": "b", "effect": "NoSchedule"}]}})
    node = await call(core.read_node, "node-0000")
    assert [t.key for t in node.spec.taints] == ["b"], "taints are an atomic list, as in the real API"
    await call(core.create_namespaced_pod, "default", pod("p"))
    patch = {"spec": {"containers": [{"name": "sidecar", "image": "envoy"}]}}
    patched = await call(core.patch_namespaced_pod, "p", "default", patch)
    assert sorted(c.name for c in patched.spec.containers) == ["c", "sidecar"], "containers merge by name"


async def test_discovery_reports_the_core_group_version_as_v1(cluster: Running) -> None:
    api = official(cluster.url)
    resources = await call(client.CoreV1Api(api).get_api_resources)
    assert resources.group_version == "v1"
    assert any(r.name == "pods/binding" for r in resources.resources)


async def test_a_watch_resumes_from_its_resource_version_and_gets_410_once_history_is_gone(cluster: Running) -> None:
    kube = KubeClient.connect(cluster.url)
    core = client.CoreV1Api(official(cluster.url))
    _, rv = await kube.list(PODS, "default")
    await call(core.create_namespaced_pod, "default", pod("late"))
    stream = await kube.open_watch(PODS, "default", resource_version=rv, timeout_s=1)
    events: list[dict[str, object]] = []
    await kube.iterate(stream, events.append)
    assert [e["type"] for e in events if e["type"] != "BOOKMARK"] == ["ADDED"]
    assert any(e["type"] == "BOOKMARK" for e in events), "bookmarks were asked for and sent"
    cluster.api.compact()
    stream = await kube.open_watch(PODS, "default", resource_version=rv, timeout_s=1)
    expired: list[dict[str, object]] = []
    await kube.iterate(stream, expired.append)
    assert expired[0]["type"] == "ERROR"
    assert expired[0]["object"]["code"] == 410  # type: ignore[index]
    await kube.close()


async def test_the_reflector_relists_after_410_and_reports_what_changed_meanwhile(cluster: Running) -> None:
    kube = KubeClient.connect(cluster.url)
    core = client.CoreV1Api(official(cluster.url))
    await call(core.create_namespaced_pod, "default", pod("stays"))
    await call(core.create_namespaced_pod, "default", pod("goes"))
    seen: list[tuple[str, str]] = []

    async def on_event(kind: str, obj: dict[str, object]) -> None:
        seen.append((kind, obj["metadata"]["name"]))  # type: ignore[index]

    stop = asyncio.Event()
    reflector = Reflector(kube, PODS, on_event, namespace="default")
    task = asyncio.create_task(reflector.run(stop))
    await reflector.synced.wait()
    assert sorted(seen) == [("ADDED", "goes"), ("ADDED", "stays")]
    cluster.api.drop_watches()  # the watch breaks; while it is down, history is compacted away ...
    cluster.api.compact()
    cluster.api.remove("/v1/pods", "default", "goes")  # ... and an object is deleted
    cluster.api.compact()
    await eventually(lambda: ("DELETED", "goes") in seen, what="the deletion seen through a relist")
    assert reflector.lists == 2, "410 Gone made it list again"
    await call(core.create_namespaced_pod, "default", pod("new"))
    await eventually(lambda: ("ADDED", "new") in seen, what="watching again after the relist")
    stop.set()
    await task
    await kube.close()


async def test_a_reflector_whose_sync_handler_fails_lists_again_and_goes_on_following(cluster: Running) -> None:
    """The intake publishes from its `on_synced`; NATS away at that moment used to end the reflector's task
    silently, and that kind of workload was never followed again."""
    kube = KubeClient.connect(cluster.url)
    syncs: list[int] = []
    seen: list[str] = []

    async def on_synced(objects: dict[str, Any]) -> None:
        syncs.append(len(objects))
        if len(syncs) == 1:
            raise RuntimeError("injected: the bus is away")

    async def on_event(kind: str, obj: dict[str, Any]) -> None:
        seen.append(obj["metadata"]["name"])

    stop = asyncio.Event()
    reflector = Reflector(kube, PODS, on_event, namespace="default", on_synced=on_synced)
    task = asyncio.create_task(reflector.run(stop))
    await eventually(lambda: len(syncs) == 2, what="the sync handler run again after it failed")
    await kube.create(PODS, pod("after"), "default")
    await eventually(lambda: "after" in seen, what="still following")
    assert not task.done()
    stop.set()
    await task
    await kube.close()


async def test_the_intake_publishes_a_submit_and_a_cancel_nats_did_not_store_once_it_is_back(
    cluster: Running, bus: Any, settings: Settings
) -> None:
    """A suspended Job that does not change again brings no watch event to retry its submit with; nor does a
    deleted one for its cancel. JetStream away for longer than the intake's few tries must lose neither."""
    import time

    from chamber.common.bus import PublishError
    from chamber.common.clock import SystemClock
    from chamber.common.jobstore import JobStore
    from chamber.common.kube.client import JOBS
    from chamber.common.runtime import Context
    from chamber.gateway.kube_intake import Intake
    from tests.support.kube import gpu_job

    kube = KubeClient.connect(cluster.url)
    published: list[str] = []
    publish = bus.publish
    away_until = time.monotonic() + 1e9

    async def jetstream_away(subject: str, value: Any, **kw: Any) -> Any:
        if time.monotonic() < away_until:
            raise PublishError("injected: no JetStream")
        published.append(type(value).__name__)
        return await publish(subject, value, **kw)

    bus.publish = jetstream_away
    ctx = Context(settings, "gateway", SystemClock(), bus.names)
    intake = Intake(ctx, bus, kube, await JobStore.open(bus))
    stop = asyncio.Event()
    task = asyncio.create_task(intake.run(stop))
    try:
        job = gpu_job("waits")
        job["metadata"]["labels"]["chamber.io/managed"] = "true"  # as the mutating webhook marks it
        job["spec"]["suspend"] = True
        await kube.create(JOBS, job, "default")
        await eventually(lambda: intake.unsent, what="the submit kept for later", within=15)
        await kube.delete(JOBS, "waits", "default")
        await eventually(lambda: len(intake.unsent) == 2, what="the cancel kept for later", within=15)
        away_until = time.monotonic()
        await eventually(lambda: not intake.unsent, what="both published once JetStream is back", within=15)
        assert published == ["JobSubmitted", "JobCancelRequested"]
    finally:
        stop.set()
        await task
        bus.publish = publish
        await kube.close()


async def test_an_answer_that_breaks_off_is_the_adapters_error_not_the_librarys() -> None:
    """The client library returns before the body is read; a body cut short (an API server restarting) raised
    urllib3's ProtocolError, which nothing following the cluster expected."""
    import socket
    import threading

    from chamber.common.kube.errors import KubeUnavailable

    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def answer_half() -> None:
        conn, _ = server.accept()
        conn.recv(65536)
        conn.sendall(b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"items": [')
        conn.close()

    threading.Thread(target=answer_half, daemon=True).start()
    kube = KubeClient.connect(f"http://127.0.0.1:{port}")
    with pytest.raises(KubeUnavailable, match="broke off"):
        await kube.list(PODS, "default")
    await kube.close()
    server.close()


async def test_the_emulated_kubelet_runs_a_bound_pod_and_nodes_carry_gpu_labels(cluster: Running) -> None:
    kube = KubeClient.connect(cluster.url)
    nodes, _ = await kube.list(NODES)
    labels = nodes[0]["metadata"]["labels"]
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100"
    assert nodes[0]["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    await kube.create(PODS, pod("run"), "default")
    await kube.bind("default", "run", "node-0001")

    async def running() -> bool:
        return bool((await kube.get(PODS, "run", "default"))["status"]["phase"] == "Running")

    await eventually(running, what="the kubelet started the pod")
    await kube.close()


async def test_the_webhook_certificate_hook_issues_once_and_injects_the_ca(cluster: Running) -> None:
    from chamber.cli.kubesim.cluster import webhook_configurations
    from chamber.cli.webhook_cert import MUTATING, SECRETS, VALIDATING, ensure

    kube = KubeClient.connect(cluster.url)
    before = await ensure(kube, "chamber", "chamber-webhooks", "chamber-webhook-tls", "chamber")
    assert before.startswith("certificate issued")
    assert "on 0 webhook" in before, "pre-install: no configurations yet"
    for rkey, obj in webhook_configurations("https://unused"):
        cluster.api.create(rkey, obj)
    after = await ensure(kube, "chamber", "chamber-webhooks", "chamber-webhook-tls", "chamber")
    assert after.startswith("certificate kept"), "post-install: the same certificate"
    assert "on 2 webhook" in after, "post-install: the CA in both configurations"
    secret = await kube.get(SECRETS, "chamber-webhook-tls", "chamber")
    for kind in (MUTATING, VALIDATING):
        config = await kube.get(kind, "chamber")
        assert {h["clientConfig"]["caBundle"] for h in config["webhooks"]} == {secret["data"]["ca.crt"]}
    await kube.close()


async def test_a_renewed_webhook_certificate_is_trusted_before_it_is_served_and_the_old_one_meanwhile(
    cluster: Running,
) -> None:
    """The renewal (the daily CronJob, or an upgrade's hook) puts the new CA into the configurations before the
    Secret changes, next to the old CA: the gateway serves the old certificate until its mounted Secret is updated
    and reloaded, and with failurePolicy Fail an admission it could not answer would refuse a labelled Job."""
    import base64
    import datetime

    from cryptography import x509

    from chamber.cli.kubesim.cluster import webhook_configurations
    from chamber.cli.webhook_cert import MUTATING, SECRETS, VALIDATING, dns_names, ensure, issue

    for rkey, obj in webhook_configurations("https://unused"):
        cluster.api.create(rkey, obj)
    kube = KubeClient.connect(cluster.url)
    args = ("chamber", "chamber-webhooks", "chamber-webhook-tls", "chamber")
    assert (await ensure(kube, *args)).startswith("certificate issued")
    due = issue(dns_names("chamber-webhooks", "chamber"), datetime.datetime.now(datetime.UTC), days=10)
    secret = await kube.get(SECRETS, "chamber-webhook-tls", "chamber")
    secret["data"] = {k: base64.b64encode(v).decode() for k, v in due.items()}
    await kube.request("PUT", SECRETS.path("chamber", "chamber-webhook-tls"), body=secret)

    renewed = await ensure(kube, *args)
    assert renewed.startswith("certificate issued"), "10 days left: renewed"
    new_ca = base64.b64decode((await kube.get(SECRETS, "chamber-webhook-tls", "chamber"))["data"]["ca.crt"])

    async def trusted() -> list[list[x509.Certificate]]:
        bundles = []
        for kind in (MUTATING, VALIDATING):
            for hook in (await kube.get(kind, "chamber"))["webhooks"]:
                bundles.append(x509.load_pem_x509_certificates(base64.b64decode(hook["clientConfig"]["caBundle"])))
        return bundles

    expected = [x509.load_pem_x509_certificate(new_ca), x509.load_pem_x509_certificate(due["ca.crt"])]
    assert all(bundle == expected for bundle in await trusted()), "the new CA first, and the old one still"
    assert (await ensure(kube, *args)).startswith("certificate kept")
    assert all(bundle == expected for bundle in await trusted()), "a later run keeps both until the next renewal"
    await kube.close()


async def test_two_renewals_at_once_leave_the_configurations_trusting_the_certificate_the_secret_holds(
    cluster: Running,
) -> None:
    """An upgrade's hook and the daily CronJob may renew at the same moment. The one that writes the Secret second
    must not overwrite the first one's certificate after the first put its own CA into the configurations (they
    would then trust a certificate nobody serves, and every labelled Job would be refused until the next run)."""
    import base64
    import datetime
    from typing import Any

    from cryptography import x509

    from chamber.cli.kubesim.cluster import webhook_configurations
    from chamber.cli.webhook_cert import MUTATING, SECRETS, VALIDATING, dns_names, ensure, issue

    for rkey, obj in webhook_configurations("https://unused"):
        cluster.api.create(rkey, obj)
    kube = KubeClient.connect(cluster.url)
    rival = KubeClient.connect(cluster.url)
    args = ("chamber", "chamber-webhooks", "chamber-webhook-tls", "chamber")
    await ensure(kube, *args)
    due = issue(dns_names("chamber-webhooks", "chamber"), datetime.datetime.now(datetime.UTC), days=10)
    secret = await kube.get(SECRETS, "chamber-webhook-tls", "chamber")
    secret["data"] = {k: base64.b64encode(v).decode() for k, v in due.items()}
    await kube.request("PUT", SECRETS.path("chamber", "chamber-webhook-tls"), body=secret)

    class Racing:
        """The Kubernetes client of a run that another run overtakes: just before it writes the Secret, the
        other one renews from start to end."""

        raced = False

        def __getattr__(self, name: str) -> Any:
            return getattr(kube, name)

        async def request(self, method: str, path: str, **kwargs: Any) -> Any:
            if method == "PUT" and "/secrets/" in path and not self.raced:
                self.raced = True
                assert (await ensure(rival, *args)).startswith("certificate issued")
            return await kube.request(method, path, **kwargs)

    outcome = await ensure(Racing(), *args)  # type: ignore[arg-type]
    assert outcome.startswith("certificate kept"), "it lost the race and keeps what the other run wrote"
    held = base64.b64decode((await kube.get(SECRETS, "chamber-webhook-tls", "chamber"))["data"]["ca.crt"])
    expected = [x509.load_pem_x509_certificate(held), x509.load_pem_x509_certificate(due["ca.crt"])]
    for kind in (MUTATING, VALIDATING):
        for hook in (await kube.get(kind, "chamber"))["webhooks"]:
            bundle = x509.load_pem_x509_certificates(base64.b64decode(hook["clientConfig"]["caBundle"]))
            assert bundle == expected, "the CA of the certificate the Secret holds, then the one served before"
    await kube.close()
    await rival.close()


def test_a_malformed_block_in_the_ca_bundle_does_not_drop_the_ca_still_served() -> None:
    import datetime

    from chamber.cli.webhook_cert import ca_bundle, issue

    now = datetime.datetime.now(datetime.UTC)
    names = ["chamber-webhooks", "chamber-webhooks.chamber", "chamber-webhooks.chamber.svc"]
    old, new = issue(names, now)["ca.crt"], issue(names, now)["ca.crt"]
    garbage = b"-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n"
    assert ca_bundle(new, garbage + old, now) == new + old
    assert ca_bundle(new, new + old, now) == new + old, "the current CA is not counted twice"
    assert ca_bundle(new, b"", now) == new


def managed_job(name: str) -> dict[str, Any]:
    """A GPU Job as the mutating webhook leaves it: marked for Chamber and suspended."""
    from tests.support.kube import gpu_job

    job = gpu_job(name)
    job["metadata"]["labels"]["chamber.io/managed"] = "true"
    job["spec"]["suspend"] = True
    return job


@contextlib.contextmanager
def recorded(bus: Any, *, fail_first: bool = False) -> Iterator[list[tuple[str, str]]]:
    """Every event published on `bus` meanwhile, as (its type, its job id); `fail_first`: the first publish
    raises an unexpected error (not a BusError) instead."""
    publish = bus.publish
    published: list[tuple[str, str]] = []
    failed: list[bool] = []

    async def recording(subject: str, value: Any, **kw: Any) -> Any:
        if fail_first and not failed:
            failed.append(True)
            raise RuntimeError("injected: not a BusError")
        published.append((type(value).__name__, getattr(value, "job_id", "")))
        return await publish(subject, value, **kw)

    bus.publish = recording
    try:
        yield published
    finally:
        bus.publish = publish


async def create_managed(kube: KubeClient, *names: str) -> dict[str, str]:
    """Managed Jobs made in the emulated cluster, in order: name -> its Chamber job id."""
    from chamber.common.kube.client import JOBS
    from chamber.common.kube.workloads import job_id_for

    ids = {}
    for name in names:
        made = await kube.create(JOBS, managed_job(name), "default")
        ids[name] = job_id_for(made["metadata"]["uid"])
    return ids


@contextlib.asynccontextmanager
async def running_intake(settings: Settings, bus: Any, kube: KubeClient, gate: Any = None) -> AsyncIterator[Any]:
    """The gateway's Kubernetes intake, watching the emulated cluster until the block ends."""
    from chamber.common.clock import SystemClock
    from chamber.common.jobstore import JobStore
    from chamber.common.runtime import Context
    from chamber.gateway.kube_intake import Intake

    intake = Intake(Context(settings, "gateway", SystemClock(), bus.names), bus, kube, await JobStore.open(bus),
                    gate=gate)  # fmt: skip
    stop = asyncio.Event()
    task = asyncio.create_task(intake.run(stop))
    try:
        yield intake
    finally:
        stop.set()
        await task


async def test_a_burst_of_jobs_passes_the_gateways_intake_gate(cluster: Running, bus: Any, settings: Settings) -> None:
    """Jobs made in Kubernetes are submitted no faster than the scheduler takes submits in, as API submits are
    (`IntakeGate`): with one place and nothing taken in, the second Job's submit waits until the first is."""
    from chamber.common.kube.client import JOBS
    from chamber.gateway.intake import IntakeGate

    kube = KubeClient.connect(cluster.url)
    gate = IntakeGate(1, max_wait_s=30.0, forget_s=30.0)
    try:
        with recorded(bus) as published:
            async with running_intake(settings, bus, kube, gate):
                for name in ("first", "second"):
                    await kube.create(JOBS, managed_job(name), "default")
                await eventually(lambda: len(published) == 1, what="the first Job submitted", within=15)
                await asyncio.sleep(1.0)
                assert len(published) == 1, "the second waits while the first is not taken in"
                gate.taken(published[0][1])  # the scheduler wrote its record
                await eventually(lambda: len(published) == 2, what="the second Job submitted", within=15)
    finally:
        await kube.close()


async def test_jobs_waiting_at_the_intake_gate_hold_up_no_cancel(
    cluster: Running, bus: Any, settings: Settings
) -> None:
    """New Jobs wait for their turn at the gate apart from the watch: a deleted Job's cancel goes out at once
    behind a burst of waiting Jobs (it used to wait up to a second per Job ahead of it), and a Job deleted while
    it waits is never submitted (but cancelled: after a restart, a Job an earlier gateway submitted waits too)."""
    from chamber.common.kube.client import JOBS
    from chamber.gateway.intake import IntakeGate

    kube = KubeClient.connect(cluster.url)
    gate = IntakeGate(1, max_wait_s=30.0, forget_s=30.0)
    try:
        with recorded(bus) as published:
            async with running_intake(settings, bus, kube, gate) as intake:
                ids = await create_managed(kube, "first", "second", "third")
                first = ("JobSubmitted", ids["first"])
                await eventually(lambda: published == [first], what="the first submitted", within=15)
                await eventually(lambda: len(intake.waiting) == 2, what="the others waiting at the gate", within=15)
                await kube.delete(JOBS, "first", "default")
                cancel = ("JobCancelRequested", ids["first"])
                await eventually(lambda: cancel in published, what="the cancel", within=5)
                await kube.delete(JOBS, "second", "default")
                await eventually(lambda: ids["second"] not in intake.waiting, what="the waiting Job gone", within=5)
                cancel = ("JobCancelRequested", ids["second"])
                await eventually(lambda: cancel in published, what="its cancel", within=5)
                gate.taken(ids["first"])  # the scheduler took the first in
                third = ("JobSubmitted", ids["third"])
                await eventually(lambda: third in published, what="the third submitted", within=15)
                assert published == [
                    ("JobSubmitted", ids["first"]),
                    ("JobCancelRequested", ids["first"]),
                    ("JobCancelRequested", ids["second"]),
                    ("JobSubmitted", ids["third"]),
                ], "the second Job, deleted while it waited, was never submitted"
    finally:
        await kube.close()


async def test_a_job_deleted_at_the_gate_gives_its_turn_to_the_next(
    cluster: Running, bus: Any, settings: Settings
) -> None:
    """The Job whose turn at the gate the worker awaits is deleted: the worker stops waiting for it and goes on to
    the next at once (it used to wait out the gate for the deleted Job, up to `max_wait_s`)."""
    from chamber.common.kube.client import JOBS
    from chamber.gateway.intake import IntakeGate

    kube = KubeClient.connect(cluster.url)
    gate = IntakeGate(1, max_wait_s=30.0, forget_s=30.0)
    try:
        with recorded(bus) as published:
            async with running_intake(settings, bus, kube, gate) as intake:
                ids = await create_managed(kube, "first", "second", "third")
                await eventually(lambda: published == [("JobSubmitted", ids["first"])], what="the first", within=15)
                await eventually(lambda: intake.at_the_gate == ids["second"], what="the second's turn", within=15)
                await kube.delete(JOBS, "second", "default")
                await eventually(lambda: intake.at_the_gate == ids["third"], what="the third's turn", within=5)
                gate.taken(ids["first"])  # the scheduler took the first in: the third goes
                third = ("JobSubmitted", ids["third"])
                await eventually(lambda: third in published, what="the third submitted", within=15)
                assert ("JobSubmitted", ids["second"]) not in published
    finally:
        await kube.close()


async def test_a_relisted_job_deleted_while_it_waits_is_still_cancelled(
    cluster: Running, bus: Any, settings: Settings
) -> None:
    """After a gateway restart the list brings every Job again: one a previous gateway submitted (its record is
    known) queues behind a new one waiting at the gate. Deleted then, its Chamber job must still be cancelled."""
    from chamber.common.contracts import JobSubmitted
    from chamber.common.kube.client import JOBS
    from chamber.common.kube.workloads import job_id_for, job_spec
    from chamber.gateway.intake import IntakeGate

    kube = KubeClient.connect(cluster.url)
    ids: dict[str, str] = {}
    try:
        for name in ("fresh", "old"):
            made = await kube.create(JOBS, managed_job(name), "default")
            ids[name] = job_id_for(made["metadata"]["uid"])
            if name == "old":  # submitted by the gateway before it restarted
                await bus.publish(
                    bus.names.job_submit(ids[name]),
                    JobSubmitted(job_id=ids[name], spec=job_spec(made), submitted_at=0.0),
                    msg_id=ids[name],
                )
        gate = IntakeGate(1, max_wait_s=30.0, forget_s=30.0, known=lambda j: j == ids["old"])
        await gate.admit("an-api-submit")  # the gateway's gate is full with API submits
        with recorded(bus) as published:
            async with running_intake(settings, bus, kube, gate) as intake:
                await eventually(lambda: len(intake.waiting) == 2, what="both relisted Jobs waiting", within=15)
                await kube.delete(JOBS, "old", "default")
                await eventually(lambda: ids["old"] not in intake.waiting, what="the delete seen", within=5)
                await asyncio.sleep(1.0)
                assert ("JobCancelRequested", ids["old"]) in published, f"the old job is never cancelled: {published}"
    finally:
        await kube.close()


async def test_one_failed_submit_does_not_end_the_intake(cluster: Running, bus: Any, settings: Settings) -> None:
    """An unexpected error publishing one submit (anything but a BusError) is logged, and the intake goes on with
    the next Job (the failed one is tried again at its Job's next event or list), as it did when the watch handler
    published (`Reflector._deliver` logged it)."""
    from chamber.common.kube.client import JOBS

    kube = KubeClient.connect(cluster.url)
    try:
        with recorded(bus, fail_first=True) as published:
            async with running_intake(settings, bus, kube):
                for name in ("first", "second"):
                    await kube.create(JOBS, managed_job(name), "default")
                    await asyncio.sleep(0.5)
                await eventually(lambda: len(published) >= 1, what="the second Job submitted", within=10)
    finally:
        await kube.close()
