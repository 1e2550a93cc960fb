"""Kubernetes workloads as Chamber jobs: pure reading of Job objects (plain dicts), no client, no I/O.

One rule for each question, used by the admission webhooks, the intake and the executor alike: is this
workload Chamber's, which team, what gang (replicas x GPUs), which Chamber job id, is it done, which replica is
this pod, how did this pod end. A workload Chamber cannot run is a `Rejection` whose message the user sees
in `kubectl` (the validating webhook's answer).

Supported: `batch/v1` Job (one replica per completion index: `parallelism == completions`, `Indexed` when more
than one) and `jobset.x-k8s.io/v1alpha2` JobSet (one gang of every pod of every replicated Job, all asking for
the same GPUs; replica `offset(replicated Job) + job index x parallelism + completion index`) and Kubeflow's
`kubeflow.org/v1` PyTorchJob (one gang of its Master then its Workers, all asking for the same GPUs; replica
`offset(replica type) + replica index`) and Kubeflow Trainer v2's `trainer.kubeflow.org/v1alpha1` TrainJob (one
gang of its `numNodes` trainer pods, `resourcesPerNode` each; what the TrainJob leaves out is read from the
training runtime it references, which the caller fetches and passes in, so these readers stay pure).
"""

import copy
import datetime
import math
from typing import Any

import msgspec

from chamber.common.contracts import JobSpec, WorkloadRef
from chamber.common.kube import labels as L
from chamber.common.priorities import DEFAULT_CLASSES

Obj = dict[str, Any]
JOB_ID_PREFIX = "k8s-"
MAX_REPLICAS = 1024
JOB = "batch/v1/Job"
JOBSET = "jobset.x-k8s.io/v1alpha2/JobSet"
PYTORCHJOB = "kubeflow.org/v1/PyTorchJob"
TRAINJOB = "trainer.kubeflow.org/v1alpha1/TrainJob"
SUPPORTED = (JOB, JOBSET, PYTORCHJOB, TRAINJOB)
TRAINER_GROUP = "trainer.kubeflow.org"
RUNTIME_KINDS = ("ClusterTrainingRuntime", "TrainingRuntime")
MULTIKUEUE = "kueue.x-k8s.io/multikueue"
PYTORCH_REPLICA_TYPES = ("Master", "Worker")
"""A PyTorchJob's replica specs, in gang order: the Master is replica 0 (rank 0), the Workers follow."""


class Rejection(ValueError):
    """A workload Chamber cannot run, with the reason its owner needs to fix it."""


def meta(obj: Obj) -> Obj:
    m: Obj = obj.get("metadata") or {}
    return m


def labels_of(obj: Obj) -> dict[str, str]:
    return dict(meta(obj).get("labels") or {})


def annotations_of(obj: Obj) -> dict[str, str]:
    return dict(meta(obj).get("annotations") or {})


def team_of(obj: Obj) -> str | None:
    """`chamber.io/team`, else Kueue's queue name (a Kueue user switches by changing nothing)."""
    lab = labels_of(obj)
    return lab.get(L.TEAM) or lab.get(L.KUEUE_QUEUE) or None


def is_candidate(obj: Obj) -> bool:
    """A workload that asks for Chamber (the webhooks act on these only)."""
    return team_of(obj) is not None


def is_managed(obj: Obj) -> bool:
    return labels_of(obj).get(L.MANAGED) == "true"


def job_id_for(uid: str) -> str:
    """The Chamber job id of a workload: stable for its uid, so every re-delivery names the same job."""
    return f"{JOB_ID_PREFIX}{uid}"


def workload_ref(obj: Obj) -> WorkloadRef:
    m = meta(obj)
    return WorkloadRef(
        api_version=str(obj.get("apiVersion") or "batch/v1"), kind=str(obj.get("kind") or "Job"),
        namespace=str(m.get("namespace") or "default"), name=str(m.get("name") or ""), uid=str(m.get("uid") or ""),
    )  # fmt: skip


def pod_template(job: Obj) -> Obj:
    tpl: Obj = (job.get("spec") or {}).get("template") or {}
    return tpl


def gpus_of_pod_spec(pod_spec: Obj) -> int:
    """GPUs one pod asks for: the sum over its containers' `nvidia.com/gpu` limits (requests when no limit)."""
    total = 0
    for container in pod_spec.get("containers") or []:
        res = container.get("resources") or {}
        value = (res.get("limits") or {}).get(L.GPU_RESOURCE, (res.get("requests") or {}).get(L.GPU_RESOURCE, 0))
        try:
            total += int(str(value))
        except ValueError as exc:
            raise Rejection(
                f"container {container.get('name')!r}: {L.GPU_RESOURCE}={value!r} is not a whole number"
            ) from exc
    return total


def kind_of(obj: Obj) -> str:
    return f"{obj.get('apiVersion', 'batch/v1')}/{obj.get('kind', 'Job')}"


def replicas_of(job: Obj, *, indexed_by_default: bool = False) -> int:
    """Pods of one `batch/v1` Job spec (a Job's, or one replicated Job's of a JobSet)."""
    spec = job.get("spec") or {}
    parallelism = int(spec.get("parallelism", 1) or 0)
    completions = spec.get("completions")
    if parallelism < 1:
        raise Rejection("spec.parallelism must be at least 1: Chamber runs a Job as a gang of `parallelism` pods")
    if completions is not None and int(completions) != parallelism:
        raise Rejection(
            f"spec.completions ({completions}) must equal spec.parallelism ({parallelism}): Chamber runs every "
            "replica of a gang at once"
        )
    mode = spec.get("completionMode") or ("Indexed" if indexed_by_default else "NonIndexed")
    if parallelism > 1 and mode != "Indexed":
        raise Rejection("a gang of more than one pod needs spec.completionMode: Indexed (one index per replica)")
    if parallelism > MAX_REPLICAS:
        raise Rejection(f"spec.parallelism ({parallelism}) is above Chamber's limit of {MAX_REPLICAS} replicas")
    return parallelism


def _float(annotations: dict[str, str], key: str) -> float | None:
    raw = annotations.get(key)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError as exc:
        raise Rejection(f"annotation {key}={raw!r} is not a number") from exc
    if not math.isfinite(value):
        raise Rejection(f"annotation {key}={raw!r} is not a finite number of seconds")
    return value


def replicated_jobs(jobset: Obj) -> list[Obj]:
    rjobs: list[Obj] = (jobset.get("spec") or {}).get("replicatedJobs") or []
    return rjobs


def jobset_layout(jobset: Obj) -> dict[str, tuple[int, int]]:
    """Replicated Job name -> (its first replica's index in the gang, pods per child Job)."""
    layout, offset = {}, 0
    for rjob in replicated_jobs(jobset):
        parallelism = int(((rjob.get("template") or {}).get("spec") or {}).get("parallelism", 1) or 1)
        layout[str(rjob.get("name"))] = (offset, parallelism)
        offset += int(rjob.get("replicas", 1)) * parallelism
    return layout


def pytorch_replica_specs(pytorchjob: Obj) -> dict[str, Obj]:
    specs: dict[str, Obj] = (pytorchjob.get("spec") or {}).get("pytorchReplicaSpecs") or {}
    return specs


def replica_template(replica_spec: Obj) -> Obj:
    """The pod template of one PyTorchJob replica spec (`template`, beside `replicas`)."""
    tpl: Obj = replica_spec.get("template") or {}
    return tpl


def pytorch_layout(pytorchjob: Obj) -> dict[str, tuple[int, int]]:
    """Replica type (lower-cased, as the training operator labels pods) -> (its first replica's index in the
    gang, 1): the Master first, then the Workers by replica index."""
    layout, offset = {}, 0
    specs = pytorch_replica_specs(pytorchjob)
    for rtype in PYTORCH_REPLICA_TYPES:
        if rtype in specs:
            layout[rtype.lower()] = (offset, 1)
            offset += int(specs[rtype].get("replicas", 1) or 0)
    return layout


def workload_layout(obj: Obj) -> dict[str, tuple[int, int]] | None:
    """The replica layout `replica_of` needs for a JobSet or a PyTorchJob; None for a Job."""
    kind = kind_of(obj)
    if kind == JOBSET:
        return jobset_layout(obj)
    if kind == PYTORCHJOB:
        return pytorch_layout(obj)
    return None


def _pytorch_pod_specs(pytorchjob: Obj) -> tuple[list[tuple[str, Obj]], int]:
    specs = pytorch_replica_specs(pytorchjob)
    if not specs:
        raise Rejection("spec.pytorchReplicaSpecs is empty")
    unknown = sorted(set(specs) - set(PYTORCH_REPLICA_TYPES))
    if unknown:
        raise Rejection(f"spec.pytorchReplicaSpecs has {', '.join(unknown)}: a PyTorchJob has only Master and Worker")
    pods, total = [], 0
    for rtype in PYTORCH_REPLICA_TYPES:
        if rtype not in specs:
            continue
        replicas = int(specs[rtype].get("replicas", 1) or 0)
        if replicas < 1:
            raise Rejection(f"spec.pytorchReplicaSpecs.{rtype}.replicas must be at least 1")
        if rtype == "Master" and replicas != 1:
            raise Rejection(f"spec.pytorchReplicaSpecs.Master.replicas is {replicas}: a PyTorchJob has one Master")
        total += replicas
        pods.append(
            (f"spec.pytorchReplicaSpecs.{rtype}.template.spec", replica_template(specs[rtype]).get("spec") or {})
        )
    if total > MAX_REPLICAS:
        raise Rejection(f"the PyTorchJob has {total} pods, above Chamber's limit of {MAX_REPLICAS} replicas")
    return pods, total


def _pod_specs(obj: Obj, runtime: Obj | None = None) -> tuple[list[tuple[str, Obj]], int]:
    """(where, pod spec) of every pod template of a workload, and how many pods its gang has."""
    kind = kind_of(obj)
    if kind == JOB:
        return [("spec.template.spec", pod_template(obj).get("spec") or {})], replicas_of(obj)
    if kind == JOBSET:
        rjobs = replicated_jobs(obj)
        if not rjobs:
            raise Rejection("spec.replicatedJobs is empty")
        specs, total = [], 0
        for i, rjob in enumerate(rjobs):
            job = rjob.get("template") or {}
            total += int(rjob.get("replicas", 1)) * replicas_of(job, indexed_by_default=True)
            specs.append((f"spec.replicatedJobs[{i}].template.spec.template.spec", pod_template(job).get("spec") or {}))
        if total > MAX_REPLICAS:
            raise Rejection(f"the JobSet has {total} pods, above Chamber's limit of {MAX_REPLICAS} replicas")
        return specs, total
    if kind == PYTORCHJOB:
        return _pytorch_pod_specs(obj)
    if kind == TRAINJOB:
        return _trainjob_pod_specs(obj, runtime)
    raise Rejection(
        f"{kind} is not supported: submit a batch/v1 Job, a JobSet, a PyTorchJob or a TrainJob (docs/kubernetes.md)"
    )


# ---- Kubeflow Trainer v2: TrainJob and its training runtime ---------------------------------------------------


def runtime_ref(trainjob: Obj) -> tuple[str, str]:
    """(kind, name) of the training runtime a TrainJob references (`spec.runtimeRef`; the kind defaults to
    ClusterTrainingRuntime, as the trainer's CRD defaults it)."""
    ref: Obj = (trainjob.get("spec") or {}).get("runtimeRef") or {}
    name = str(ref.get("name") or "")
    if not name:
        raise Rejection("spec.runtimeRef.name is missing: a TrainJob names the training runtime it runs on")
    group, kind = ref.get("apiGroup") or TRAINER_GROUP, ref.get("kind") or "ClusterTrainingRuntime"
    if group != TRAINER_GROUP or kind not in RUNTIME_KINDS:
        raise Rejection(
            f"spec.runtimeRef is {group}/{kind}: Chamber reads {TRAINER_GROUP}'s ClusterTrainingRuntime and "
            "TrainingRuntime only"
        )
    return kind, name


def runtime_replicated_jobs(runtime: Obj) -> list[Obj]:
    """The replicated Jobs of a training runtime's JobSet template."""
    rjobs: list[Obj] = (((runtime.get("spec") or {}).get("template") or {}).get("spec") or {}).get(
        "replicatedJobs"
    ) or []
    return rjobs


def is_trainer_step(rjob: Obj) -> bool:
    """A replicated Job whose pods train: labelled `trainer.kubeflow.org/trainjob-ancestor-step: trainer` (the
    label the trainer itself finds it by)."""
    return bool(labels_of(rjob.get("template") or {}).get(L.TRAINJOB_ANCESTOR) == L.ANCESTOR_TRAINER)


def trainer_pod_spec(trainjob: Obj, trainer_rjob: Obj) -> Obj:
    """The trainer's pod spec as the trainer builds it: the runtime's template with the TrainJob's `image`,
    `command`, `args` and `resourcesPerNode` on the `node` container."""
    pod_spec: Obj = copy.deepcopy(pod_template(trainer_rjob.get("template") or {}).get("spec") or {})
    trainer: Obj = (trainjob.get("spec") or {}).get("trainer") or {}
    per_node: Obj = trainer.get("resourcesPerNode") or {}
    for container in pod_spec.get("containers") or []:
        if container.get("name") != L.TRAINER_CONTAINER:
            continue
        for key in ("image", "command", "args"):
            if trainer.get(key) is not None:
                container[key] = trainer[key]
        if per_node.get("limits") or per_node.get("requests"):
            container["resources"] = {k: v for k, v in per_node.items() if k in ("limits", "requests") and v}
    return pod_spec


def trainer_nodes(trainjob: Obj, runtime: Obj) -> int:
    """`spec.trainer.numNodes`, else the runtime's `spec.mlPolicy.numNodes`, else 1 (the trainer's defaults)."""
    trainer: Obj = (trainjob.get("spec") or {}).get("trainer") or {}
    policy: Obj = (runtime.get("spec") or {}).get("mlPolicy") or {}
    return int(trainer.get("numNodes") or policy.get("numNodes") or 1)


def _trainjob_pod_specs(trainjob: Obj, runtime: Obj | None) -> tuple[list[tuple[str, Obj]], int]:
    kind, name = runtime_ref(trainjob)
    if (trainjob.get("spec") or {}).get("managedBy") == MULTIKUEUE:
        raise Rejection(f"spec.managedBy is {MULTIKUEUE}: this TrainJob is MultiKueue's to dispatch, not Chamber's")
    if runtime is None:
        raise Rejection(
            f"the {kind} {name!r} named by spec.runtimeRef does not exist: Chamber reads the GPUs per node and the "
            "trainer's pod template from it"
        )
    policy: Obj = (runtime.get("spec") or {}).get("mlPolicy") or {}
    where = f"{kind} {name!r}"
    if policy.get("mpi") is not None:
        raise Rejection(f"{where} is an MPI runtime (a launcher beside the nodes): not supported by Chamber yet")
    if ((policy.get("torch") or {}).get("elasticPolicy")) is not None:
        raise Rejection(f"{where} has torch.elasticPolicy: Chamber runs a fixed gang of numNodes pods")
    rjobs = runtime_replicated_jobs(runtime)
    trainers = [r for r in rjobs if is_trainer_step(r)]
    if len(trainers) != 1:
        raise Rejection(
            f"{where} has {len(trainers)} replicated Jobs labelled {L.TRAINJOB_ANCESTOR}={L.ANCESTOR_TRAINER}: "
            "Chamber schedules exactly one trainer step"
        )
    for rjob in rjobs:
        if rjob is trainers[0]:
            continue
        step = f"{where}, replicated Job {rjob.get('name')!r}"
        pod_spec = pod_template(rjob.get("template") or {}).get("spec") or {}
        if gpus_of_pod_spec(pod_spec):
            raise Rejection(f"{step} asks for {L.GPU_RESOURCE}: Chamber books GPUs for the trainer's nodes only")
        if pod_spec.get("schedulerName") == L.SCHEDULER_NAME:
            raise Rejection(
                f"{step} has schedulerName {L.SCHEDULER_NAME}: Chamber binds only the trainer's pods; leave the "
                "initializers to the default scheduler"
            )
    pod_spec = trainer_pod_spec(trainjob, trainers[0])
    scheduler = pod_spec.get("schedulerName")
    if scheduler != L.SCHEDULER_NAME:
        raise Rejection(
            f"{where}: the trainer's pod template has schedulerName {scheduler or 'default-scheduler'!r}; a TrainJob "
            f"cannot set it, so the runtime must say schedulerName: {L.SCHEDULER_NAME} for Chamber to place its "
            "nodes (docs/kubernetes.md)"
        )
    nodes = trainer_nodes(trainjob, runtime)
    if not 1 <= nodes <= MAX_REPLICAS:
        raise Rejection(f"spec.trainer.numNodes is {nodes}: Chamber runs 1 to {MAX_REPLICAS} nodes")
    return [(f"{where} trainer template (with spec.trainer)", pod_spec)], nodes


def trainer_layout(jobset: Obj) -> dict[str, tuple[int, int]]:
    """The replica layout (see `replica_of`) of the JobSet the trainer made for a TrainJob: its trainer step only,
    whose pods are the gang (the initializers' pods are not Chamber's)."""
    return {
        str(rjob.get("name")): (0, int(((rjob.get("template") or {}).get("spec") or {}).get("parallelism", 1) or 1))
        for rjob in replicated_jobs(jobset)
        if is_trainer_step(rjob)
    }


def job_spec(job: Obj, *, largest_node_gpus: int = 0, runtime: Obj | None = None) -> JobSpec:
    """The Chamber job a workload (`batch/v1` Job, JobSet, PyTorchJob, TrainJob) stands for. Raises `Rejection`
    with what to fix. A TrainJob needs the training runtime its `spec.runtimeRef` names (`runtime`; None when it
    does not exist)."""
    m, lab, ann = meta(job), labels_of(job), annotations_of(job)
    team = team_of(job)
    if team is None:
        raise Rejection(f"label {L.TEAM} (or {L.KUEUE_QUEUE}) is missing")
    specs, replicas = _pod_specs(job, runtime)
    counts = set()
    for where, pod_spec in specs:
        if pod_spec.get("nodeName"):
            raise Rejection(f"{where}.nodeName is set: Chamber chooses the nodes; remove it")
        scheduler = pod_spec.get("schedulerName")
        if scheduler not in (None, "", "default-scheduler", L.SCHEDULER_NAME):
            raise Rejection(f"{where}.schedulerName is {scheduler!r}: Chamber binds these pods itself")
        counts.add(gpus_of_pod_spec(pod_spec))
    if len(counts) > 1:
        raise Rejection(f"every pod of the gang must ask for the same number of GPUs (here {sorted(counts)})")
    gpus = counts.pop()
    tpl_spec = specs[0][1]
    if gpus < 1:
        raise Rejection(
            f"the pod template asks for no {L.GPU_RESOURCE}: Chamber schedules GPU work; set a {L.GPU_RESOURCE} "
            f"limit, or remove the {L.TEAM} label to leave this Job to the default scheduler"
        )
    if largest_node_gpus and gpus > largest_node_gpus:
        raise Rejection(
            f"each pod asks for {gpus} GPUs but the largest node has {largest_node_gpus}: use more replicas "
            "(parallelism) with fewer GPUs each"
        )
    priority = lab.get(L.PRIORITY, "train")
    if priority not in DEFAULT_CLASSES:
        raise Rejection(f"label {L.PRIORITY}={priority!r} is unknown; use one of {', '.join(DEFAULT_CLASSES)}")
    topology = None
    if level := ann.get(L.TOPOLOGY):
        if level not in ("node", "rack", "zone"):
            raise Rejection(f"annotation {L.TOPOLOGY}={level!r}: use node, rack or zone")
        topology = {"level": level, "required": ann.get(L.TOPOLOGY_REQUIRED, "true") != "false"}
    preemptible = ann.get(L.PREEMPTIBLE)
    grace = tpl_spec.get("terminationGracePeriodSeconds", 30)
    containers = tpl_spec.get("containers") or [{}]
    if kind_of(job) == TRAINJOB:  # the trainer's image is its `node` container's
        containers = [c for c in containers if c.get("name") == L.TRAINER_CONTAINER] or containers
    raw: Obj = {
        "name": str(m.get("name") or m.get("generateName") or "job")[:128], "team": team,
        "gpus_per_replica": gpus, "replicas": replicas, "priority": priority, "pool": lab.get(L.POOL),
        "gpu_model": ann.get(L.GPU_MODEL), "topology": topology,
        "checkpoint_grace_s": float(grace or 0), "min_runtime_s": _float(ann, L.MIN_RUNTIME_S) or 0.0,
        "checkpoint_interval_s": _float(ann, L.CHECKPOINT_INTERVAL_S),
        "max_runtime_s": _run_policy(job).get("activeDeadlineSeconds") if kind_of(job) == PYTORCHJOB
        else (job.get("spec") or {}).get("activeDeadlineSeconds"),
        "preemptible": None if preemptible is None else preemptible == "true",
        "image": containers[0].get("image"), "workload": msgspec.structs.asdict(workload_ref(job)),
    }  # fmt: skip
    try:
        return msgspec.convert(raw, JobSpec)
    except msgspec.ValidationError as exc:
        raise Rejection(f"cannot run this Job: {exc}") from exc


def _run_policy(pytorchjob: Obj) -> Obj:
    policy: Obj = (pytorchjob.get("spec") or {}).get("runPolicy") or {}
    return policy


def admission_patch(job: Obj) -> list[Obj]:
    """JSON patch the mutating webhook returns for a workload Chamber takes: suspended, marked, its pods for
    Chamber's scheduler. Idempotent (the patch of a patched workload changes nothing)."""
    ops: list[Obj] = []
    if not meta(job).get("labels"):
        ops.append({"op": "add", "path": "/metadata/labels", "value": {}})
    ops.append({"op": "add", "path": "/metadata/labels/chamber.io~1managed", "value": "true"})
    if kind_of(job) == TRAINJOB:  # no pod template: the runtime sets the trainer's schedulerName (see above)
        ops.append({"op": "add", "path": "/spec/suspend", "value": True})
        return ops
    if kind_of(job) == PYTORCHJOB:
        if not _run_policy(job):
            ops.append({"op": "add", "path": "/spec/runPolicy", "value": {}})
        ops.append({"op": "add", "path": "/spec/runPolicy/suspend", "value": True})
    else:
        ops.append({"op": "add", "path": "/spec/suspend", "value": True})
    templates = [("/spec/template", pod_template(job))]
    if kind_of(job) == PYTORCHJOB:
        templates = [
            (f"/spec/pytorchReplicaSpecs/{rtype}/template", replica_template(rspec))
            for rtype, rspec in pytorch_replica_specs(job).items()
        ]
    if kind_of(job) == JOBSET:
        templates = [
            (f"/spec/replicatedJobs/{i}/template/spec/template", pod_template(rjob.get("template") or {}))
            for i, rjob in enumerate(replicated_jobs(job))
        ]
    for path, tpl in templates:
        if not tpl.get("spec"):
            ops.append({"op": "add", "path": f"{path}/spec", "value": {}})
        ops.append({"op": "add", "path": f"{path}/spec/schedulerName", "value": L.SCHEDULER_NAME})
    return ops


# ---- the state of Jobs and pods, as the executor reads it ------------------------------------------------------


def condition(obj: Obj, kind: str) -> Obj | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            c: Obj = cond
            return c
    return None


def job_outcome(job: Obj) -> tuple[bool, str] | None:
    """(succeeded, message) once the Job completed or failed; None while it is not finished. A Job and a
    TrainJob say `Complete`, a JobSet `Completed`, a PyTorchJob `Succeeded`."""
    if any(condition(job, c) for c in ("Complete", "SuccessCriteriaMet", "Completed", "Succeeded")):
        return True, ""
    failed = condition(job, "Failed")
    if failed is not None:
        return False, f"{failed.get('reason', 'Failed')}: {failed.get('message', '')}".rstrip(": ")
    return None


def replica_of(pod: Obj, layout: dict[str, tuple[int, int]] | None = None) -> int:
    """The replica a pod is in its gang: a Job's completion index (0 for a one-pod Job); in a JobSet, its
    replicated Job's offset + job index x parallelism + completion index; in a PyTorchJob, its replica type's
    offset + replica index (`layout` from `workload_layout`)."""
    lab = labels_of(pod)

    def number(key: str) -> int:
        # The controller's label first (a template's annotation of the same key would otherwise override it), and
        # ASCII digits only: "²" is a digit to `isdigit` and raised in `int` (found by review).
        raw = lab.get(key) or annotations_of(pod).get(key) or "0"
        return int(raw) if raw.isascii() and raw.isdigit() else 0

    rtype = lab.get(L.REPLICA_TYPE)
    if layout is not None and rtype in layout:
        return layout[rtype][0] + number(L.REPLICA_INDEX)
    index = number(L.COMPLETION_INDEX)
    rjob = lab.get(L.REPLICATED_JOB)
    if layout is not None and rjob in layout:
        offset, parallelism = layout[rjob]
        return offset + number(L.JOBSET_JOB_INDEX) * parallelism + index
    return index


def pod_owner_uid(pod: Obj) -> str:
    lab = labels_of(pod)
    return lab.get(L.CONTROLLER_UID) or lab.get("controller-uid") or ""


def pod_attempt(pod: Obj) -> int | None:
    raw = annotations_of(pod).get(L.ATTEMPT)
    return int(raw) if raw is not None and raw.isascii() and raw.isdigit() else None


def pod_exit(pod: Obj) -> tuple[int | None, str]:
    """(exit code, reason) of a pod's first terminated container: `OOMKilled`, `Error`, `Completed` ..."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        term = (status.get("state") or {}).get("terminated")
        if term:
            code = term.get("exitCode")
            return (int(code) if code is not None else None), str(term.get("reason") or "")
    return None, ""


def pod_disrupted(pod: Obj) -> str:
    """Why a pod was taken away (eviction, preemption by the kubelet, node gone); empty when it was not."""
    status = pod.get("status") or {}
    target = condition(pod, "DisruptionTarget")
    if target is not None:
        return str(target.get("reason") or "DisruptionTarget")
    if status.get("reason") in ("Evicted", "NodeLost", "Shutdown", "Terminated"):
        return str(status["reason"])
    return ""


def timestamp(value: str | None) -> float | None:
    """An RFC 3339 time from the API as seconds since the epoch."""
    if not value:
        return None
    try:
        return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
