"""The Helm chart, rendered and linted by the real Helm engine (helm-python-sdk: Helm v4's Go code), every
manifest validated against the Kubernetes schemas (kubernetes-validate, strict) of each supported version."""

import base64
import functools
import json
from pathlib import Path, PurePosixPath
from typing import Any

import helm_python
import kubernetes_validate
import pytest
import yaml

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "chamber"
KUBE_VERSIONS = ("1.32.0", "1.33.0", "1.34.0", "1.35.0")
"""The Kubernetes versions Chamber supports (Chart.yaml: kubeVersion >= 1.32)."""
CRD_KINDS = {"ServiceMonitor", "Certificate", "Issuer"}
"""Custom resources (Prometheus Operator, cert-manager) that the Kubernetes schemas do not cover."""

VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "external-nats-and-valkey": {
        "nats": {"enabled": False, "url": "nats://nats.infra:4222"},
        "valkey": {"enabled": False, "existingSecret": "chamber-redis"},
    },
    "clustered-nats-with-password": {"nats": {"replicas": 3}, "valkey": {"password": "s3cret"}},
    "cert-manager-and-observability": {
        "certManager": {"enabled": True},
        "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}}},
        "grafana": {"dashboard": {"enabled": True}},
    },
    "locked-down": {
        "networkPolicy": {"enabled": True, "apiFrom": [{"namespaceSelector": {"matchLabels": {"team": "ml"}}}]},
        "kubernetes": {"namespaces": ["ml", "research"]},
        "nodeAgent": {"enabled": False},
        "quota": {"config": "teams: {}\n"},
        "health": {"rules": "[]\n"},
        "gateway": {"adminTokenSecret": {"name": "chamber-admin"}},
    },
    "system-pool": {
        "controlPlane": {
            "nodeSelector": {"pool": "system"},
            "priorityClassName": "system-cluster-critical",
            "tolerations": [{"key": "system", "operator": "Exists", "effect": "NoSchedule"}],
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "nvidia.com/gpu.present", "operator": "DoesNotExist"}]}
                    ]
                }
            },
        },
        "nats": {"replicas": 3, "streamReplicas": 3},
    },
}


@functools.cache
def rendered(variant: str) -> tuple[dict[str, Any], ...]:
    return tuple(render(VARIANTS[variant]))


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    chart = helm_python.Chart.load(CHART)
    out = chart.render(values, name="chamber", namespace="chamber", is_install=True)
    docs = []
    for path, text in out.items():
        if path.endswith("NOTES.txt"):
            continue
        docs += [d for d in yaml.safe_load_all(text) if d]
    return docs


def kinds(docs: list[dict[str, Any]]) -> dict[str, int]:
    counted: dict[str, int] = {}
    for doc in docs:
        counted[doc["kind"]] = counted.get(doc["kind"], 0) + 1
    return dict(sorted(counted.items()))


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_chart_lints_clean(variant: str) -> None:
    report = helm_python.lint(CHART, VARIANTS[variant], strict=True, namespace="chamber", kube_version="v1.33.0")
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not problems, problems
    assert not report["errors"], report["errors"]


@pytest.mark.parametrize("version", KUBE_VERSIONS)
def test_every_manifest_of_every_variant_is_valid_kubernetes(version: str) -> None:
    unique = {json.dumps(doc, sort_keys=True): doc for variant in VARIANTS for doc in rendered(variant)}
    for doc in unique.values():
        if doc["kind"] in CRD_KINDS:
            continue
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            raise AssertionError(f"{doc['kind']} {doc['metadata']['name']} on {version}: {exc}") from exc


def test_the_default_install_runs_everything_with_a_standby_scheduler() -> None:
    docs = render({})
    assert kinds(docs) == {
        "ClusterRole": 7, "ClusterRoleBinding": 7, "CronJob": 1, "DaemonSet": 1, "Deployment": 5, "Job": 1,
        "MutatingWebhookConfiguration": 1, "PodDisruptionBudget": 1, "Role": 2, "RoleBinding": 2, "Secret": 2,
        "Service": 6, "ServiceAccount": 8, "StatefulSet": 2, "ValidatingWebhookConfiguration": 1,
    }  # fmt: skip
    by_name = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    scheduler = by_name[("Deployment", "chamber-scheduler")]
    assert scheduler["spec"]["replicas"] == 2
    env = {e["name"]: e.get("value") for e in scheduler["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["CHAMBER_EXECUTOR"] == "kubernetes"
    assert env["CHAMBER_KUBE_API"] == "in-cluster"
    gateway = by_name[("Deployment", "chamber-gateway")]["spec"]["template"]["spec"]["containers"][0]["env"]
    # the gateway checks submits against the executor (a command is refused by a simulated one) and says where a
    # job's output is: it must know jobs run in Kubernetes too
    assert {e["name"]: e.get("value") for e in gateway}["CHAMBER_EXECUTOR"] == "kubernetes"
    assert env["CHAMBER_NATS_URL"] == "nats://chamber:$(CHAMBER_NATS_PASSWORD)@chamber-nats:4222"
    assert (env["CHAMBER_SCHEDULER_CONSOLIDATE"], env["CHAMBER_SCHEDULER_RECLAIM_PAST_GUARANTEE"]) == ("true", "true")
    agent = by_name[("DaemonSet", "chamber-node-agent")]["spec"]["template"]["spec"]
    assert agent["runtimeClassName"] == "nvidia"
    assert agent["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    (container,) = agent["containers"]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["pod-resources"] == {"name": "pod-resources", "mountPath": "/var/lib/kubelet/pod-resources",
                                       "readOnly": True}, "the kubelet's PodResources directory, read-only"  # fmt: skip
    volumes = {v["name"]: v for v in agent["volumes"]}
    assert volumes["pod-resources"]["hostPath"] == {"path": "/var/lib/kubelet/pod-resources", "type": "Directory"}
    agent_env = {e["name"]: e.get("value") for e in container["env"]}
    assert agent_env["CHAMBER_POD_RESOURCES_SOCKET"] == "/var/lib/kubelet/pod-resources/kubelet.sock"
    assert agent["automountServiceAccountToken"] is True, "it lists its node's pods to name each device's job"
    assert (agent["securityContext"]["runAsUser"], container["securityContext"]["capabilities"]) == (
        0, {"drop": ["ALL"]},
    ), "root only to reach the kubelet's root-owned socket, without capabilities"  # fmt: skip
    without = render({"nodeAgent": {"podResources": {"enabled": False}}})
    plain = next(d for d in without if d["kind"] == "DaemonSet")["spec"]["template"]["spec"]
    assert "pod-resources" not in {v["name"] for v in plain["volumes"]}
    assert (plain["automountServiceAccountToken"], plain["securityContext"]["runAsNonRoot"]) == (False, True)
    assert "chamber-node-agent" not in {d["metadata"]["name"] for d in without if d["kind"] == "ClusterRole"}
    hook = by_name[("Job", "chamber-webhook-cert")]
    assert "pre-install" in hook["metadata"]["annotations"]["helm.sh/hook"]
    renew = by_name[("CronJob", "chamber-webhook-cert-renew")]
    assert renew["spec"]["schedule"] == "17 3 * * *", "renewed 30 days before it expires, upgraded or not"
    renew_pod = renew["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert renew_pod["containers"][0]["args"] == hook["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "helm.sh/hook" not in (renew["metadata"].get("annotations") or {}), "it lives with the release"
    webhook = by_name[("MutatingWebhookConfiguration", "chamber")]["webhooks"][0]
    assert webhook["clientConfig"]["service"]["name"] == "chamber-webhooks"
    assert webhook["objectSelector"]["matchExpressions"][0]["key"] == "chamber.io/team"
    assert {r["resources"][0] for r in webhook["rules"]} == {"jobs", "jobsets", "pytorchjobs", "trainjobs"}


def test_rbac_is_least_privilege() -> None:
    roles = {d["metadata"]["name"]: d["rules"] for d in render({}) if d["kind"] == "ClusterRole"}
    verbs = {name: {(r["resources"][0], v) for r in rules for v in r["verbs"]} for name, rules in roles.items()}
    assert verbs["chamber-gateway"] == {
        (resource, verb) for resource in ("jobs", "jobsets", "pytorchjobs", "trainjobs") for verb in ("list", "watch")
    } | {("clustertrainingruntimes", "get"), ("trainingruntimes", "get")}, "a TrainJob's runtime is read, never changed"
    for workload in ("pytorchjobs", "trainjobs"):
        assert {(workload, v) for v in ("get", "list", "watch", "patch", "delete")} <= verbs["chamber-scheduler"]
    assert verbs["chamber-collector"] == {("nodes", "list"), ("nodes", "watch")}
    assert verbs["chamber-node-agent"] == {("pods", "list"), ("pods", "watch")}, "its node's pods, read-only"
    assert ("pods/binding", "create") in verbs["chamber-scheduler"]
    assert ("pods/eviction", "create") in verbs["chamber-health"]
    creates = {(name, r["resources"][0]) for name, rules in roles.items() for r in rules for v in r["verbs"]
               if v in ("*", "create") and r["resources"][0] in ("jobs", "nodes", "secrets")}  # fmt: skip
    assert not creates, "no service creates Jobs, nodes or secrets"
    webhooks = ["mutatingwebhookconfigurations", "validatingwebhookconfigurations"]
    expected = {"apiGroups": ["admissionregistration.k8s.io"], "resourceNames": ["chamber"], "verbs": ["get", "patch"]}
    for name in ("chamber-webhook-cert", "chamber-webhook-cert-renew"):
        assert roles[name] == [dict(expected, resources=webhooks)], (
            "the certificate hook and its daily run may touch Chamber's webhook configurations and nothing else"
        )
    renew = next(d for d in render({}) if d["kind"] == "Role" and d["metadata"]["name"] == "chamber-webhook-cert-renew")
    secret = {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["chamber-webhook-tls"]}
    assert renew["rules"] == [dict(secret, verbs=["get", "update"])], "the webhooks' Secret only, never a new one"


def test_variants_switch_parts_on_and_off() -> None:
    external = kinds(render(VARIANTS["external-nats-and-valkey"]))
    assert "StatefulSet" not in external
    gateway = next(
        d for d in render(VARIANTS["external-nats-and-valkey"]) if d["metadata"]["name"] == "chamber-gateway"
    )
    env = {e["name"]: e for e in gateway["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["CHAMBER_REDIS_URL"]["valueFrom"]["secretKeyRef"] == {"name": "chamber-redis", "key": "url"}
    clustered = render(VARIANTS["clustered-nats-with-password"])
    conf = next(d for d in clustered if d["kind"] == "Secret" and d["metadata"]["name"] == "chamber-nats")
    assert conf["stringData"]["nats.conf"].count("@chamber-nats-") == 3, "three routes, each logging in"
    assert "no_advertise: true" in conf["stringData"]["nats.conf"]
    gateway = next(d for d in clustered if d["kind"] == "Deployment" and d["metadata"]["name"] == "chamber-gateway")
    gateway_env = {e["name"]: e.get("value") for e in gateway["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert gateway_env["CHAMBER_NATS_REPLICAS"] == "3", "every stream and bucket kept on three servers"
    observed = kinds(render(VARIANTS["cert-manager-and-observability"]))
    assert observed["ServiceMonitor"] == 1
    assert observed["Certificate"] == 1
    assert "Job" not in observed, "cert-manager issues the certificate: no hook Job"
    assert "CronJob" not in observed, "and cert-manager renews it"
    dashboard = next(
        d for d in render(VARIANTS["cert-manager-and-observability"]) if d["metadata"]["name"] == "chamber-dashboard"
    )
    assert '"uid": "chamber-fleet"' in dashboard["data"]["chamber-fleet.json"]
    assert kinds(render(VARIANTS["locked-down"]))["NetworkPolicy"] == 5


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"scheduler": {"replicas": 0}}, "minimum"),
        ({"nats": {"enabled": False}}, "nats"),
        ({"gateway": {"webhook": {"failurePolicy": "Sometimes"}}}, "failurePolicy"),
        ({"schedular": {}}, "schedular"),
        ({"nats": {"auth": {"password": "p@ss/word"}}}, "password"),
        ({"valkey": {"password": "has space"}}, "password"),
        ({"liveness": {"maxAgeSeconds": 5, "periodSeconds": 10, "failureThreshold": 3}}, "maxAgeSeconds"),
    ],
)
def test_values_schema_refuses_bad_values(values: dict[str, Any], complaint: str) -> None:
    with pytest.raises(helm_python.HelmError, match=complaint):
        render(values)


def test_the_first_admin_token_can_come_from_a_secret() -> None:
    """Without it the gateway mints the token and prints it in its log, where anyone who reads pod logs finds it."""

    def gateway_env(values: dict[str, Any]) -> dict[str, Any]:
        docs = render(values)
        gw = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "chamber-gateway")
        return {e["name"]: e for e in gw["spec"]["template"]["spec"]["containers"][0]["env"]}

    assert "CHAMBER_ADMIN_TOKEN" not in gateway_env({})
    env = gateway_env({"gateway": {"adminTokenSecret": {"name": "chamber-admin"}}})
    assert env["CHAMBER_ADMIN_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "chamber-admin", "key": "token"}}


def _containers(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        f"{d['kind']}/{d['metadata']['name']}/{c['name']}": c
        for d in docs
        if d["kind"] in ("Deployment", "DaemonSet", "StatefulSet")
        for c in d["spec"]["template"]["spec"]["containers"]
    }


def test_nats_and_valkey_ask_every_client_for_a_password_by_default() -> None:
    """Without one, any pod that reaches NATS could write itself an admin token into the tokens KV, and any pod that
    reaches Valkey could rewrite the GPU ledger; NetworkPolicies are opt-in and depend on the CNI."""
    docs = render({})
    secrets = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Secret"}
    nats_password = secrets["chamber-nats"]["stringData"]["password"]
    assert len(nats_password) == 32, "generated when not given"
    assert nats_password.isalnum()
    conf = secrets["chamber-nats"]["stringData"]["nats.conf"]
    assert f'authorization {{\n  user: chamber\n  password: "{nats_password}"\n}}' in conf
    valkey = next(d for d in docs if d["kind"] == "StatefulSet" and d["metadata"]["name"] == "chamber-valkey")
    assert valkey["spec"]["template"]["spec"]["containers"][0]["args"][-2:] == ["--requirepass", "$(VALKEY_PASSWORD)"]
    clients = {name: c for name, c in _containers(docs).items() if "nats" not in name and "valkey" not in name}
    assert len(clients) == 6, "five services (the scheduler and its standby are one Deployment) and the node agent"
    for name, container in clients.items():
        env = [e["name"] for e in container["env"]]
        refs = {e["name"]: e["valueFrom"].get("secretKeyRef") for e in container["env"] if "valueFrom" in e}
        assert refs["CHAMBER_NATS_PASSWORD"] == {"name": "chamber-nats", "key": "password"}, name
        assert env.index("CHAMBER_NATS_PASSWORD") < env.index("CHAMBER_NATS_URL"), "defined before it is used"
        if "node-agent" in name:
            # Found by review: the agent never opens the ledger, and a pod on a GPU node, next to user workloads,
            # that could write it could double-book GPUs: it gets neither the password nor the URL.
            assert "VALKEY_PASSWORD" not in env, name
            assert "CHAMBER_REDIS_URL" not in env, name
            continue
        assert refs["VALKEY_PASSWORD"] == {"name": "chamber-valkey", "key": "password"}, name
        assert env.index("VALKEY_PASSWORD") < env.index("CHAMBER_REDIS_URL"), "defined before it is used"
    given = render({"nats": {"auth": {"password": "n4ts.Pass"}}, "valkey": {"password": "v4lkey-Pass"}})
    secrets = {d["metadata"]["name"]: d for d in given if d["kind"] == "Secret"}
    assert secrets["chamber-nats"]["stringData"]["password"] == "n4ts.Pass"
    assert base64.b64decode(secrets["chamber-valkey"]["data"]["password"]) == b"v4lkey-Pass"
    off = render({"nats": {"auth": {"enabled": False}}, "valkey": {"auth": {"enabled": False}}})
    assert "authorization" not in next(d for d in off if d["kind"] == "Secret")["stringData"]["nats.conf"]
    plain = {e["name"]: e.get("value") for e in _containers(off)["Deployment/chamber-gateway/gateway"]["env"]}
    assert (plain["CHAMBER_NATS_URL"], plain["CHAMBER_REDIS_URL"]) == (
        "nats://chamber-nats:4222", "redis://chamber-valkey:6379/0",
    )  # fmt: skip


def test_what_a_real_cluster_needs_of_the_probes_the_agents_rollout_and_the_metrics_port() -> None:
    docs = render({})
    containers = _containers(docs)
    collector = {e["name"]: e.get("value") for e in containers["Deployment/chamber-collector/collector"]["env"]}
    assert collector["CHAMBER_HTTP_HOST"] == "0.0.0.0", "/metrics bound to 127.0.0.1 cannot be scraped"
    gateway = containers["Deployment/chamber-gateway/gateway"]
    assert gateway["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "webhooks", "scheme": "HTTPS"}, (
        "ready when the webhooks answer: with failurePolicy Fail, an API /healthz that fails while Valkey or NATS "
        "is away took the webhooks down and refused every labelled Job in the cluster"
    )
    agent = next(d for d in docs if d["kind"] == "DaemonSet")
    assert agent["spec"]["updateStrategy"]["rollingUpdate"] == {"maxSurge": "10%", "maxUnavailable": 0}
    assert agent["spec"]["minReadySeconds"] >= 15, "the new agent reports before the old one stops"
    assert agent["spec"]["template"]["spec"]["priorityClassName"] == "system-node-critical"
    gke = next(d for d in render({"nodeAgent": {"priorityClassName": ""}}) if d["kind"] == "DaemonSet")
    assert "priorityClassName" not in gke["spec"]["template"]["spec"]
    others = [c for n, c in containers.items() if n.startswith("Deployment/") and "gateway" not in n]
    assert all("readinessProbe" not in c for c in others), "no traffic goes to them: there is nothing to be ready for"


def test_a_clustered_nats_keeps_its_quorum_through_a_node_drain() -> None:
    """Found by review: nothing kept two of three NATS servers from being evicted at once (a drain) or scheduled
    onto one node (whose loss then took both): JetStream lost its quorum, and every Chamber service with it."""
    docs = render({"nats": {"replicas": 3}})
    nats = next(d for d in docs if d["kind"] == "StatefulSet" and d["metadata"]["name"] == "chamber-nats")
    labels = nats["spec"]["template"]["metadata"]["labels"]
    (budget,) = [d for d in docs if d["kind"] == "PodDisruptionBudget" and d["metadata"]["name"] == "chamber-nats"]
    assert budget["spec"]["maxUnavailable"] == 1
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (term,) = nats["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"].items() <= labels.items()
    single = render({})
    assert not [d for d in single if d["kind"] == "PodDisruptionBudget" and d["metadata"]["name"] == "chamber-nats"]
    spread = {"controlPlane": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["system"]}]}]}}},
        "nats": {"replicas": 3}}  # fmt: skip
    both = next(d for d in render(spread) if d["kind"] == "StatefulSet" and d["metadata"]["name"] == "chamber-nats")
    assert set(both["spec"]["template"]["spec"]["affinity"]) == {"nodeAffinity", "podAntiAffinity"}


def test_every_chamber_container_is_restarted_when_its_event_loop_is_stuck() -> None:
    """A service whose loop stopped turning (a hung NVML call in the node agent, a deadlock) does nothing while its
    process lives on: each Chamber container touches a file from its loop, and its liveness probe (the probe's own
    module, as the kubelet runs it) fails once the file is older than maxAgeSeconds. Found missing by review: only
    the gateway had a liveness probe, a TCP connect, which the kernel accepts while the loop is stuck."""
    docs = render({"liveness": {"maxAgeSeconds": 45, "periodSeconds": 15, "failureThreshold": 4}})
    chamber = {n: c for n, c in _containers(docs).items() if "nats" not in n and "valkey" not in n}
    assert len(chamber) == 6, "five services (the scheduler and its standby are one Deployment) and the node agent"
    for name, container in chamber.items():
        env = {e["name"]: e.get("value") for e in container["env"]}
        probe = container["livenessProbe"]
        assert probe["exec"]["command"] == ["python", "-m", "chamber.common.alive", env["CHAMBER_ALIVE_FILE"], "45"]
        assert (probe["periodSeconds"], probe["failureThreshold"]) == (15, 4), name
        mounts = {m["mountPath"] for m in container["volumeMounts"]}
        assert str(PurePosixPath(env["CHAMBER_ALIVE_FILE"]).parent) in mounts, "writable under a read-only root"
        assert container["securityContext"]["readOnlyRootFilesystem"] is True, name


def test_a_configuration_change_restarts_what_reads_it_and_no_pod_carries_a_password_hash() -> None:
    """Health and quota read their rules and seed only at start; a hash of a password on a pod (readable by whoever
    may list pods) would be a verifier for offline guessing, so none is there."""

    def annotations(values: dict[str, Any]) -> dict[str, dict[str, str]]:
        return {
            f"{d['kind']}/{d['metadata']['name']}": d["spec"]["template"]["metadata"].get("annotations", {})
            for d in render(values)
            if d["kind"] in ("Deployment", "DaemonSet", "StatefulSet")
        }

    before = annotations({"nats": {"auth": {"password": "hunter2"}}})
    assert {k for k, a in before.items() if a} == {
        "Deployment/chamber-health", "Deployment/chamber-quota", "StatefulSet/chamber-nats"
    }  # fmt: skip
    assert annotations({"nats": {"auth": {"password": "other"}}}) == before
    rules = annotations({"health": {"rules": "- {name: r, signal: xid, severity: fatal, xids: [13]}\n"}})
    health = "Deployment/chamber-health"
    assert rules[health]["checksum/config"] != before[health]["checksum/config"]


def test_the_grpc_api_is_served_and_reachable() -> None:
    """Found by review: the gateway listened for gRPC, but the chart declared no port for it, no Service port, and
    the default-deny NetworkPolicy blocked it."""
    docs = render({"networkPolicy": {"enabled": True}})
    gateway = _containers(docs)["Deployment/chamber-gateway/gateway"]
    env = {e["name"]: e.get("value") for e in gateway["env"]}
    assert env["CHAMBER_GRPC_PORT"] == "50051"
    assert {"name": "grpc", "containerPort": 50051} in gateway["ports"]
    service = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "chamber-api")
    assert {"name": "grpc", "port": 50051, "targetPort": "grpc"} in service["spec"]["ports"]
    policy = next(d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == "chamber-gateway")
    assert {"port": "grpc"} in policy["spec"]["ingress"][0]["ports"]


def test_a_change_to_the_nats_configuration_restarts_the_nats_servers() -> None:
    """Found by review: going from 1 NATS server to 3 changed only `replicas`; nats-0 kept its standalone
    configuration beside the new cluster, and JetStream split in two. The pod template carries a checksum of what
    shapes the configuration (not the password)."""

    def checksum(values: dict[str, Any]) -> str:
        nats = next(d for d in render(values) if d["kind"] == "StatefulSet" and d["metadata"]["name"] == "chamber-nats")
        annotations: dict[str, str] = nats["spec"]["template"]["metadata"]["annotations"]
        return annotations["checksum/config"]

    one = checksum({})
    assert checksum({"nats": {"replicas": 3}}) != one
    assert checksum({"nats": {"auth": {"password": "another-Pass1"}}}) == one, "no verifier of the password"


def test_streams_on_an_existing_clustered_nats_can_be_replicated() -> None:
    """Found by review: with the chart's NATS off, CHAMBER_NATS_REPLICAS was never set, and no value set it: every
    stream and bucket on an existing NATS cluster kept one copy."""

    def replicas(values: dict[str, Any]) -> str | None:
        gateway = _containers(render(values))["Deployment/chamber-gateway/gateway"]
        return {e["name"]: e.get("value") for e in gateway["env"]}.get("CHAMBER_NATS_REPLICAS")

    external = {"nats": {"enabled": False, "url": "nats://nats.messaging:4222"}}
    assert replicas(external) is None
    assert replicas({"nats": {**external["nats"], "streamReplicas": 3}}) == "3"
    assert replicas({"nats": {"replicas": 3}}) == "3"


def test_chambers_own_pods_can_be_placed_off_the_gpu_nodes() -> None:
    """Found by review: the schema refused nodeSelector, tolerations and affinity for every component, so the
    services, NATS and Valkey could not be kept off GPU nodes (where a quarantine drains every pod but DaemonSets')
    nor put on a tainted system pool. `controlPlane` places them all (not the node agent); the scheduler keeps its
    pod anti-affinity beside a node affinity."""
    affinity = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "nvidia.com/gpu.present", "operator": "DoesNotExist"}]}]}}  # fmt: skip
    values = {"controlPlane": {"nodeSelector": {"pool": "system"}, "priorityClassName": "system-cluster-critical",
                               "tolerations": [{"key": "system", "operator": "Exists", "effect": "NoSchedule"}],
                               "nodeAffinity": affinity}}  # fmt: skip
    docs = render(values)
    pods = {f"{d['kind']}/{d['metadata']['name']}": d["spec"]["template"]["spec"]
            for d in docs if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet")}  # fmt: skip
    for name, pod in pods.items():
        if name == "DaemonSet/chamber-node-agent":
            assert "nodeSelector" not in pod or pod["nodeSelector"] != {"pool": "system"}, name
            continue
        assert pod["nodeSelector"] == {"pool": "system"}, name
        assert pod["tolerations"] == values["controlPlane"]["tolerations"], name
        assert pod["priorityClassName"] == "system-cluster-critical", name
        assert pod["affinity"]["nodeAffinity"] == affinity, name
    assert "podAntiAffinity" in pods["Deployment/chamber-scheduler"]["affinity"]
    plain = render({})
    scheduler = next(d for d in plain if d["metadata"]["name"] == "chamber-scheduler" and d["kind"] == "Deployment")
    assert set(scheduler["spec"]["template"]["spec"]["affinity"]) == {"podAntiAffinity"}


@pytest.mark.parametrize("release", ["chamber-gpu-scheduler-production-eu1", "x" * 53])
def test_a_long_release_name_gives_names_every_kind_takes(release: str) -> None:
    """Found by review: from a 34-character release name on, the CronJob's name passed the 52 characters the API
    server takes, the NATS headless Service's the 63 of a DNS label, and the StatefulSets' the 52 that leave room
    for their pods' revision label: the install failed."""
    chart = helm_python.Chart.load(CHART)
    out = chart.render({"nats": {"replicas": 3}}, name=release, namespace="chamber", is_install=True)
    docs = [d for path, text in out.items() if not path.endswith("NOTES.txt") for d in yaml.safe_load_all(text) if d]
    limits = {"CronJob": 52, "StatefulSet": 52, "Service": 63, "Deployment": 63, "DaemonSet": 63}
    for doc in docs:
        limit = limits.get(doc["kind"])
        if limit is not None:
            assert len(doc["metadata"]["name"]) <= limit, (doc["kind"], doc["metadata"]["name"])
    services = {d["metadata"]["name"] for d in docs if d["kind"] == "Service"}
    nats = next(
        d
        for d in docs
        if d["kind"] == "StatefulSet" and d["metadata"]["labels"]["app.kubernetes.io/component"] == "nats"
    )
    assert nats["spec"]["serviceName"] in services
    gateway = _containers(docs)[next(k for k in _containers(docs) if k.endswith("gateway/gateway"))]
    url = next(e["value"] for e in gateway["env"] if e["name"] == "CHAMBER_NATS_URL")
    assert url.rsplit("@", 1)[-1].split(":")[0] in services, "clients reach the NATS Service by its name"
