"""Settings from the environment (`CHAMBER_*`), validated once at start-up with a clear message when wrong."""

import os
import re
from collections.abc import Mapping
from typing import Annotated, Literal

import msgspec

NAMESPACE_PATTERN = r"^[a-z][a-z0-9_]{0,31}$"
_POOL = r"[a-z0-9][a-z0-9-]*:[A-Za-z0-9._-]+:[0-9]+(:[0-9.]+)?"
POOLS_PATTERN = rf"^({_POOL}(,{_POOL})*)?$"


class SettingsError(ValueError):
    """A setting in the environment is missing or malformed."""


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    nats_url: str = "nats://127.0.0.1:4222"
    nats_replicas: Annotated[int, msgspec.Meta(ge=1, le=5)] = 1
    """Copies JetStream keeps of every stream and KV bucket Chamber makes (3 on a 3-server cluster: a server or its
    disk lost loses no job); existing streams are scaled to it at start."""
    nats_direct_publish: bool = True
    """JetStream publishes over a connection of their own, framed and read without nats-py (~5 us of CPU a publish
    and its ack against ~17 us; the scheduler's CPU a job 12-20% lower in `chamber bench e2e`); only for a single
    plain `nats://` server, nats-py's path otherwise. False: always nats-py's path."""
    redis_url: str = "redis://127.0.0.1:6379/0"
    namespace: Annotated[str, msgspec.Meta(pattern=NAMESPACE_PATTERN)] = "chamber"
    """Prefix of every subject, stream, KV bucket and Redis key, so several installs (or tests) share a server."""
    http_host: str = "127.0.0.1"
    http_port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 8080
    fleet_nodes: Annotated[int, msgspec.Meta(ge=0)] = 16
    gpus_per_node: Annotated[int, msgspec.Meta(ge=1, le=64)] = 8
    nodes_per_rack: Annotated[int, msgspec.Meta(ge=1)] = 4
    gpu_model: str = "H100"
    fleet_pools: Annotated[str, msgspec.Meta(pattern=POOLS_PATTERN)] = ""
    """Several pools in the simulated fleet, `name:model:nodes[:cost_per_gpu_hour]` separated by commas (e.g.
    `default:H100:120,busy:H100:8`); empty: one pool of `fleet_nodes` x `gpu_model` named `pool`."""
    telemetry_interval_s: Annotated[float, msgspec.Meta(gt=0)] = 5.0
    inventory_interval_s: Annotated[float, msgspec.Meta(gt=0)] = 30.0
    schedule_interval_s: Annotated[float, msgspec.Meta(gt=0)] = 1.0
    """The scheduler's safety-net cycle: events are decided at once; a full cycle also runs at least this often."""
    executor: Literal["simulated", "process", "kubernetes"] = "simulated"
    """How placed jobs run: `simulated` (the demo fleet), `process` (node agents start real processes),
    `kubernetes` (suspended Jobs, bound by Chamber)."""
    leader_lease_s: Annotated[float, msgspec.Meta(ge=1, le=120)] = 5.0
    """The scheduler leader's lease: a standby takes over at most this long after the leader dies."""
    scheduler_order: Literal["spf", "las", "fifo"] = "spf"
    """How jobs of one priority and team standing are ordered: shortest predicted GPU-time first (runtimes learned
    from finished jobs), least attained GPU-time first, or submit time (docs/scheduler.md)."""
    scheduler_max_wait_s: Annotated[float, msgspec.Meta(ge=0)] = 86_400.0
    """Age protection: a job waiting longer goes ahead of its priority peers (0: off)."""
    scheduler_consolidate: bool = True
    """Consolidation: move a few small preemptible jobs (each restarted at once elsewhere, from its checkpoint) to
    open a node for a multi-GPU job on a fragmented fleet (docs/scheduler.md#consolidation)."""
    scheduler_reclaim_past_guarantee: bool = True
    """A team below its guarantee may reclaim borrowed GPUs for its smallest waiting job even when that job takes
    it past the guarantee, from teams that still borrow at least as much afterwards (docs/scheduler.md#preemption);
    false: Kueue's classic rule (reclaim only within the guarantee)."""
    launch_timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 300.0
    """A placed job that has not started within this long is requeued (its GPUs released)."""
    alive_file: str = ""
    """A file the service's event loop touches every few seconds (`chamber.common.alive`), read by the Helm
    chart's liveness probes; empty: none."""
    log_level: str = "INFO"
    log_format: str = "console"
    otel_exporter: str = ""
    """Empty: tracing is a no-op. `console`: spans to stderr. `otlp`: to OTEL_EXPORTER_OTLP_ENDPOINT."""
    seed: int = 0
    metrics_port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 9400
    """The collector's Prometheus `/metrics` (dcgm-exporter's port by default; 0 picks a free one)."""
    metrics_interval_s: Annotated[float, msgspec.Meta(gt=0)] = 0.25
    collector_role: str = "all"
    """`all`: simulated fleet and metrics aggregator; `agent`: this node's GPUs through NVML;
    `aggregator`: metrics only; `sim`: simulated fleet only."""
    node_name: str = ""
    pool: str = "default"
    pool_cost_per_gpu_hour: float = 2.5
    health_rules_file: str = ""
    """YAML list of health rules added to (or, by name, replacing) the defaults (docs/health.md)."""
    quota_file: str = ""
    """YAML quota configuration that seeds the quota KV bucket when it is empty (docs/quota.md)."""
    agent_state_dir: str = ""
    """Where a node agent keeps each replica's state file and output (empty: `$XDG_STATE_HOME/chamber`, else
    `~/.local/state/chamber`); per namespace and node below it."""
    checkpoint_dir: str = ""
    """Root of the per-job checkpoint directories (`CHAMBER_CHECKPOINT_DIR` = `<root>/<job>`, the same for every
    attempt); a filesystem all nodes share for jobs that may resume on another node. Empty: under the state dir."""
    agent_address: str = ""
    """The address gang peers reach this node at (`MASTER_ADDR`); empty: the host name (127.0.0.1 for the
    simulated fleet's local agents)."""
    agent_heartbeat_s: Annotated[float, msgspec.Meta(gt=0)] = 2.0
    agent_timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 30.0
    """An agent silent this long is lost: the executor ends its replicas (interrupted, requeued), and the agent's
    replicas kill themselves if the agent has been gone that long (no GPU is used by work the ledger freed)."""
    agent_log_max_bytes: Annotated[int, msgspec.Meta(ge=4096)] = 64 * 1024 * 1024
    """Output kept per replica and attempt (the oldest quarter is dropped when full)."""
    agent_retention_s: Annotated[float, msgspec.Meta(gt=0)] = 7 * 86400.0
    """How long an ended replica's output and state are kept."""
    nvml_module: str = ""
    """A module with pynvml's functions to use instead of pynvml (tests and dry runs of the device check)."""
    pod_resources_socket: str = ""
    """The kubelet's PodResources socket the node agent reads back device assignments from (the Helm chart sets
    `/var/lib/kubelet/pod-resources/kubelet.sock`); empty: not read (off Kubernetes)."""
    grpc_port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 50051
    """The gateway's gRPC port (0 picks a free one), on `http_host`."""
    admin_token: str = ""
    """The first admin API token (docs/api.md); when empty, the gateway makes one at its first start."""
    admin_token_file: str = ""
    """Where a development admin token is kept: read when it exists, else written at first start (`make up`)."""
    intake_limit: Annotated[int, msgspec.Meta(ge=0)] = 32
    """Submits a gateway has stored that the scheduler has not yet taken in, past which a new submit waits (up to
    1 s) for one to be: a burst then waits at the door instead of behind an unseen backlog (0: no limit). The
    fewer, the lower the latency under a burst, and with a long queue the fewer jobs a second (docs/api.md)."""
    gateway_finished_jobs: Annotated[int, msgspec.Meta(ge=0)] = 50_000
    """Ended jobs a gateway keeps in memory for listing, those that ended last (every job not ended is kept; any job
    is still served by id, from the KV)."""
    access_log: bool = True
    """One log line per HTTP request (method, path, status, duration, who)."""
    kube_api: str = ""
    """The Kubernetes API (docs/kubernetes.md): empty (off), `in-cluster`, `kubeconfig` (`KUBECONFIG` or
    ~/.kube/config), or a URL (`chamber up --kube-emulator`, `kubectl proxy`)."""
    kube_namespaces: str = ""
    """Comma-separated namespaces whose workloads Chamber takes; empty: every namespace."""
    kube_webhook_host: str = "127.0.0.1"
    kube_webhook_port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 9443
    kube_webhook_cert_dir: str = ""
    """Directory with `tls.crt` and `tls.key` for the admission webhooks; empty: plain HTTP (the emulator only)."""
    kube_start_timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 120.0
    """How long the Kubernetes executor waits for an unsuspended Job's pods to appear, be bound and run."""
    kube_pool_label: str = "chamber.io/pool"
    """The node label that names a node's pool (else `CHAMBER_POOL`)."""
    inventory_source: Literal["self", "kubernetes"] = "self"
    """`self`: each telemetry source publishes its nodes' inventory; `kubernetes`: the collector's Kubernetes
    discovery does (node membership, labels, GPU counts), and sources publish telemetry only."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> "Settings":
        env = os.environ if env is None else env
        raw: dict[str, object] = {}
        for field in msgspec.structs.fields(cls):
            key = f"CHAMBER_{field.name.upper()}"
            if key in env:
                raw[field.name] = env[key]
        raw.update(overrides)
        try:
            return msgspec.convert(raw, cls, strict=False)
        except msgspec.ValidationError as exc:
            name = re.sub(r"^.*`\$\.(\w+)`.*$", r"\1", str(exc))
            raise SettingsError(f"invalid setting CHAMBER_{name.upper()}: {exc}") from exc

    def pools(self) -> list[tuple[str, str, int, float]]:
        """`fleet_pools` parsed: (name, GPU model, nodes, cost per GPU-hour)."""
        out = []
        for item in filter(None, self.fleet_pools.split(",")):
            name, model, nodes, *cost = item.split(":")
            out.append((name, model, int(nodes), float(cost[0]) if cost else self.pool_cost_per_gpu_hour))
        return out

    def to_env(self) -> dict[str, str]:
        """The environment that reproduces these settings in a child process."""
        return {f"CHAMBER_{k.upper()}": str(v) for k, v in msgspec.structs.asdict(self).items()}
