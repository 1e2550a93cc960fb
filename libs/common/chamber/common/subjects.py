"""Every NATS subject, JetStream stream and KV bucket Chamber uses, declared once.

Names are relative to a namespace (`CHAMBER_NAMESPACE`, default `chamber`): subject `jobs.submit.<job>` is
`chamber.jobs.submit.<job>` on the wire and stream `JOBS` is `CHAMBER_JOBS`. docs/architecture.md carries the
table that `render_markdown_table()` produces; a test keeps the two identical.
"""

from dataclasses import dataclass

HOUR = 3600.0
DAY = 24 * HOUR
MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class StreamSpec:
    key: str
    subjects: str
    durable: bool
    """Durable streams keep every message (file storage, no age limit); bounded ones drop by age or size."""
    description: str
    max_age_s: float | None = None
    max_bytes: int | None = None
    max_msgs_per_subject: int | None = None


@dataclass(frozen=True, slots=True)
class SubjectSpec:
    pattern: str
    stream: str
    """The stream that stores it; empty for a core NATS request/reply subject (nothing stored)."""
    payload: str
    publishers: str
    consumers: str


JOBS = StreamSpec("JOBS", "jobs.>", True, "job commands and executor reports: the durable log of every job")
DECISIONS = StreamSpec("DECISIONS", "decisions.>", True, "what the scheduler decided, for peers and audit")
INVENTORY = StreamSpec("INVENTORY", "inventory.>", True, "last inventory of each node", max_msgs_per_subject=1)
TELEMETRY = StreamSpec(
    "TELEMETRY", "telemetry.>", False, "per-node GPU telemetry batches", max_age_s=HOUR, max_bytes=512 * MIB
)
HEALTH = StreamSpec("HEALTH", "health.>", True, "health verdicts: the audit trail of quarantines and recoveries")
QUOTA = StreamSpec("QUOTA", "quota.>", True, "latest published quota state", max_msgs_per_subject=1)
METRICS = StreamSpec(
    "METRICS",
    "metrics.>",
    False,
    "fleet metrics snapshots and rollups",
    max_age_s=400 * DAY,
    max_bytes=256 * MIB,
    max_msgs_per_subject=2000,
)
CONTROL = StreamSpec("CONTROL", "control.>", False, "controls for the simulated fleet", max_age_s=HOUR)
DEADLETTER = StreamSpec(
    "DEADLETTER", "deadletter.>", False, "messages a consumer could not decode", max_age_s=7 * DAY, max_bytes=64 * MIB
)
AGENTS = StreamSpec(
    "AGENTS", "agents.>", False, "last status of each node agent (its heartbeat)", max_age_s=DAY,
    max_msgs_per_subject=1,
)  # fmt: skip
REPLICAS = StreamSpec(
    "REPLICAS", "replicas.>", False, "node agents' reports on job replicas: started, exited, could not start",
    max_age_s=7 * DAY, max_bytes=256 * MIB,
)  # fmt: skip

AUDIT = StreamSpec(
    "AUDIT", "audit.>", False, "who changed what through the API, and the result", max_age_s=400 * DAY,
    max_bytes=1024 * MIB,
)  # fmt: skip

STREAMS: tuple[StreamSpec, ...] = (
    JOBS, DECISIONS, INVENTORY, TELEMETRY, HEALTH, QUOTA, METRICS, CONTROL, DEADLETTER, AGENTS, REPLICAS, AUDIT,
)  # fmt: skip

SUBJECTS: tuple[SubjectSpec, ...] = (
    SubjectSpec("jobs.submit.<job>", "JOBS", "JobSubmitted", "gateway", "scheduler"),
    SubjectSpec("jobs.cancel.<job>", "JOBS", "JobCancelRequested", "gateway", "scheduler"),
    SubjectSpec(
        "jobs.lifecycle.<job>",
        "JOBS",
        "JobStarted, JobFinished, JobStopped, JobLaunchFailed",
        "executor (scheduler: launch deadline)",
        "scheduler",
    ),
    SubjectSpec("decisions.placed.<job>", "DECISIONS", "JobPlaced", "scheduler", "gateway (timelines), dashboard"),
    SubjectSpec("inventory.<node>", "INVENTORY", "NodeInventory", "collector", "scheduler, gateway"),
    SubjectSpec("telemetry.<node>", "TELEMETRY", "NodeTelemetryColumns, GpuXidEvent", "collector", "health, collector"),
    SubjectSpec("metrics.fleet", "METRICS", "FleetSnapshot", "collector", "gateway"),
    SubjectSpec("metrics.rollup.<1m-1h-1d>", "METRICS", "RollupPoint", "collector", "gateway"),
    SubjectSpec("metrics.scheduler", "METRICS", "SchedulerStats", "scheduler (leader)", "gateway, benchmarks"),
    SubjectSpec(
        "health.verdicts.<node>.<gpu-or-node>",
        "HEALTH",
        "GpuHealthVerdict",
        "health",
        "health (its state at start), gateway",
    ),
    SubjectSpec("health.commands.<node>", "HEALTH", "HealthCommand", "gateway (operators)", "health"),
    SubjectSpec("quota.state", "QUOTA", "QuotaState", "quota", "scheduler, gateway"),
    SubjectSpec("control.sim.faults", "CONTROL", "FaultInjection", "gateway (POST /v1/sim/faults)", "collector (sim)"),
    SubjectSpec(
        "deadletter.<service>", "DEADLETTER", "the raw message, headers say why", "every consumer", "operators"
    ),
    SubjectSpec("agents.status.<node>", "AGENTS", "AgentStatus", "node agent", "scheduler (process executor)"),
    SubjectSpec(
        "replicas.<job>",
        "REPLICAS",
        "ReplicaStarted, ReplicaExited, ReplicaLaunchFailed",
        "node agent",
        "scheduler (process executor)",
    ),
    SubjectSpec(
        "agent.<node>.launch", "", "LaunchReplicas -> AgentReply", "scheduler (process executor)", "node agent"
    ),
    SubjectSpec("agent.<node>.stop", "", "StopReplicas -> AgentReply", "scheduler (process executor)", "node agent"),
    SubjectSpec("agent.<node>.logs", "", "LogsRequest -> LogsChunk", "gateway (GET /v1/jobs/{id}/logs)", "node agent"),
    SubjectSpec("audit.<resource>", "AUDIT", "AuditRecord", "gateway (every mutating call)", "gateway (GET /v1/audit)"),
)

JOBS_BUCKET = "jobs"
"""JetStream KV bucket (`<namespace>_jobs`) holding the JobRecord of every job, written by the scheduler: its last 64
versions, the log of its changes (timelines, the process executor)."""
LEASES_BUCKET = "leases"
"""JetStream KV bucket (`<namespace>_leases`, entries expire): one key per elected role, e.g. `scheduler`."""
QUOTA_BUCKET = "quota"
"""JetStream KV bucket (`<namespace>_quota`): key `config` holds the QuotaConfig (teams, pools, budgets)."""
TOKENS_BUCKET = "tokens"
"""JetStream KV bucket (`<namespace>_tokens`): API token id -> its role, teams and the SHA-256 of its secret."""
IDEMPOTENCY_BUCKET = "idempotency"
"""JetStream KV bucket (`<namespace>_idempotency`, entries expire after a day): submit key -> the job it made."""
IDEMPOTENCY_TTL_S = DAY

BUCKETS: tuple[str, ...] = (JOBS_BUCKET, QUOTA_BUCKET, TOKENS_BUCKET, IDEMPOTENCY_BUCKET, LEASES_BUCKET)


class Names:
    """Concrete names for one namespace."""

    def __init__(self, namespace: str) -> None:
        self.ns = namespace

    def subject(self, relative: str) -> str:
        return f"{self.ns}.{relative}"

    def stream(self, spec: StreamSpec | str) -> str:
        key = spec.key if isinstance(spec, StreamSpec) else spec
        return f"{self.ns.upper()}_{key}"

    def bucket(self, name: str) -> str:
        return f"{self.ns}_{name}"

    def job_submit(self, job_id: str) -> str:
        return f"{self.ns}.jobs.submit.{job_id}"

    def job_cancel(self, job_id: str) -> str:
        return f"{self.ns}.jobs.cancel.{job_id}"

    def job_lifecycle(self, job_id: str) -> str:
        return f"{self.ns}.jobs.lifecycle.{job_id}"

    def decision_placed(self, job_id: str) -> str:
        return f"{self.ns}.decisions.placed.{job_id}"

    def inventory(self, node: str) -> str:
        return f"{self.ns}.inventory.{node}"

    def telemetry(self, node: str) -> str:
        return f"{self.ns}.telemetry.{node}"

    def health_verdict(self, node: str, gpu_index: int | None) -> str:
        """One subject per GPU (`node` for node-wide verdicts), so the stream keeps each one's history."""
        return f"{self.ns}.health.verdicts.{node}.{'node' if gpu_index is None else gpu_index}"

    def health_command(self, node: str) -> str:
        return f"{self.ns}.health.commands.{node}"

    def scheduler_stats(self) -> str:
        return f"{self.ns}.metrics.scheduler"

    def quota_state(self) -> str:
        return f"{self.ns}.quota.state"

    def deadletter(self, service: str) -> str:
        return f"{self.ns}.deadletter.{service}"

    def agent_status(self, node: str) -> str:
        return f"{self.ns}.agents.status.{node}"

    def replica_reports(self, job_id: str) -> str:
        return f"{self.ns}.replicas.{job_id}"

    def agent_request(self, node: str, op: str) -> str:
        """A request to one node's agent: `launch`, `stop` or `logs` (core NATS request/reply, not stored)."""
        return f"{self.ns}.agent.{node}.{op}"

    def audit(self, resource: str) -> str:
        return f"{self.ns}.audit.{resource}"

    def redis_prefix(self) -> str:
        """Redis keys share one hash tag so a Redis Cluster keeps them in one slot (Lua needs that)."""
        return f"{{{self.ns}}}"


def render_markdown_table() -> str:
    """The subjects table as it appears in docs/architecture.md (namespace shown as `<ns>`)."""
    streams = {s.key: s for s in STREAMS}
    lines = [
        "| subject | stream | retention | payload | published by | consumed by |",
        "|---|---|---|---|---|---|",
    ]
    for sub in SUBJECTS:
        if not sub.stream:
            stream, retention = "(none)", "request/reply, not stored"
        else:
            stream, retention = f"`<NS>_{sub.stream}`", _retention(streams[sub.stream])
        lines.append(
            f"| `<ns>.{sub.pattern}` | {stream} | {retention} | {sub.payload} | {sub.publishers} | {sub.consumers} |"
        )
    return "\n".join(lines)


def _retention(spec: StreamSpec) -> str:
    parts = ["durable" if spec.durable else "bounded"]
    if spec.max_msgs_per_subject:
        parts.append(f"last {spec.max_msgs_per_subject} per subject")
    if spec.max_age_s:
        parts.append(f"max age {spec.max_age_s / HOUR:g} h")
    if spec.max_bytes:
        parts.append(f"max {spec.max_bytes // MIB} MiB")
    return ", ".join(parts)
