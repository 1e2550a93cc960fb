"""The labels and annotations Chamber reads and writes on Kubernetes objects, declared once.

Users label a workload with `chamber.io/team` (or Kueue's `kueue.x-k8s.io/queue-name`) to hand it to Chamber;
the mutating webhook marks what it took with `chamber.io/managed`, and the intake watches only that label.
"""

GROUP = "chamber.io"
SCHEDULER_NAME = "chamber"
"""`spec.schedulerName` of every pod Chamber places: the default scheduler leaves them alone."""

TEAM = "chamber.io/team"
KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"
PRIORITY = "chamber.io/priority"
POOL = "chamber.io/pool"
MANAGED = "chamber.io/managed"
"""Set to `true` by the mutating webhook on every workload Chamber took (the intake's label selector)."""
JOB_ID = "chamber.io/job-id"
"""On a Job's pod template (set at launch): the Chamber job id, so node agents can attribute GPUs to jobs."""

# Annotations on a workload (all optional).
TOPOLOGY = "chamber.io/topology"
"""`node`, `rack` or `zone`: keep the gang's replicas together at that level."""
TOPOLOGY_REQUIRED = "chamber.io/topology-required"
"""`false`: the topology is preferred, not required (default `true`)."""
GPU_MODEL = "chamber.io/gpu-model"
PREEMPTIBLE = "chamber.io/preemptible"
MIN_RUNTIME_S = "chamber.io/min-runtime-s"
CHECKPOINT_INTERVAL_S = "chamber.io/checkpoint-interval-s"
SIM_DURATION_S = "chamber.io/sim-duration-s"
"""The emulator's kubelets run a container for this many seconds (`chamber up --kube-emulator` only)."""
SIM_EXIT_CODE = "chamber.io/sim-exit-code"
"""The exit code the emulator's kubelets give a container (default 0)."""

# Annotations Chamber writes on a Job's pod template at launch.
ATTEMPT = "chamber.io/attempt"
PLACEMENT = "chamber.io/placement"
"""Comma-separated node of each replica, in completion-index order (for people and node agents)."""

# Kubernetes' own.
JOB_NAME = "batch.kubernetes.io/job-name"
CONTROLLER_UID = "batch.kubernetes.io/controller-uid"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
GPU_RESOURCE = "nvidia.com/gpu"

# JobSet's (jobset.x-k8s.io): on its child Jobs and their pods.
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB = "jobset.sigs.k8s.io/replicatedjob-name"
JOBSET_JOB_INDEX = "jobset.sigs.k8s.io/job-index"

# Kubeflow training-operator's (kubeflow.org): on a PyTorchJob's pods.
REPLICA_TYPE = "training.kubeflow.org/replica-type"
"""`master` or `worker` (the replica spec's key, lower-cased)."""
REPLICA_INDEX = "training.kubeflow.org/replica-index"

# Kubeflow Trainer v2's (trainer.kubeflow.org): on the replicated Jobs of a training runtime's JobSet template.
TRAINJOB_ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"
"""`trainer` on the replicated Job whose pods train (`numNodes` of them, `resourcesPerNode` each); the
initializers are `dataset-initializer` and `model-initializer`."""
ANCESTOR_TRAINER = "trainer"
TRAINER_CONTAINER = "node"
"""The container of the trainer's pods that `resourcesPerNode`, `image`, `command` and `args` replace."""

# Nodes.
UNHEALTHY_TAINT = "chamber.io/gpu-unhealthy"
CORDONED_BY = "chamber.io/cordoned-by"
"""Annotation on a node Chamber cordoned (so a release uncordons only what Chamber cordoned)."""
ZONE = "topology.kubernetes.io/zone"
RACK_LABELS = ("chamber.io/rack", "topology.kubernetes.io/rack", "cloud.google.com/gce-topology-block")
NVLINK_LABELS = ("chamber.io/nvlink-domain", "nvidia.com/gpu.clique")
GFD_PRODUCT = "nvidia.com/gpu.product"
GFD_MEMORY = "nvidia.com/gpu.memory"
GFD_COUNT = "nvidia.com/gpu.count"
GFD_MIG_STRATEGY = "nvidia.com/mig.strategy"
GFD_MIG_CAPABLE = "nvidia.com/mig.capable"
