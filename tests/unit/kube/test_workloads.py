"""Reading Kubernetes Jobs as Chamber jobs: one rule for the webhooks, the intake and the executor."""

from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml

from chamber.common.kube.workloads import (
    Rejection,
    admission_patch,
    job_id_for,
    job_outcome,
    job_spec,
    jobset_layout,
    pod_disrupted,
    pod_exit,
    pytorch_layout,
    replica_of,
    runtime_ref,
    trainer_layout,
    workload_layout,
)
from tests.support.kube import gpu_job, training_runtime, trainjob


def with_(job: dict[str, Any], path: str, value: object) -> dict[str, Any]:
    *parents, leaf = path.split(".")
    node = job
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value
    return job


def test_a_job_becomes_a_gang_of_its_replicas_with_the_pod_template_gpus() -> None:
    job = gpu_job(
        "llama", replicas=4, gpus=8, priority="research", grace_s=45, annotations={"chamber.io/topology": "rack"}
    )
    job["metadata"].update(namespace="ml", uid="u-1")
    spec = job_spec(job)
    assert (spec.name, spec.team, spec.replicas, spec.gpus_per_replica, spec.priority) == (
        "llama",
        "nlp",
        4,
        8,
        "research",
    )
    assert spec.checkpoint_grace_s == 45, "the pods' termination grace is the checkpoint grace"
    assert spec.topology is not None
    assert spec.topology.level == "rack"
    assert spec.topology.required
    assert spec.workload is not None
    assert (spec.workload.namespace, spec.workload.uid) == ("ml", "u-1")
    assert job_id_for("u-1") == "k8s-u-1"


def test_kueue_queue_name_is_the_team() -> None:
    job = gpu_job("a", team="team-a", team_label="kueue.x-k8s.io/queue-name")
    assert job_spec(job).team == "team-a"


REJECTIONS = [
    ("no GPUs", gpu_job("a", gpus=0), "asks for no nvidia.com/gpu"),
    ("more GPUs than the largest node", gpu_job("a", gpus=16), "largest node has 8"),
    ("gang without indexes", with_(gpu_job("a", replicas=2), "spec.completionMode", "NonIndexed"), "Indexed"),
    ("completions differ", with_(gpu_job("a", replicas=2), "spec.completions", 4), "must equal spec.parallelism"),
    ("pinned to a node", with_(gpu_job("a"), "spec.template.spec.nodeName", "n1"), "nodeName is set"),
    ("another scheduler", with_(gpu_job("a"), "spec.template.spec.schedulerName", "volcano"), "binds these pods"),
    ("unknown priority", gpu_job("a", priority="vip"), "is unknown"),
    ("bad team name", gpu_job("a", team="Team_A"), "cannot run this Job"),
    ("bad topology", gpu_job("a", annotations={"chamber.io/topology": "pod"}), "use node, rack or zone"),
    # Infinity passed the spec's `ge=0` and was written as null: the scheduler's decoder then refused the job, lost.
    ("infinite minimum runtime", gpu_job("a", annotations={"chamber.io/min-runtime-s": "inf"}), "not a finite"),
    ("huge minimum runtime", gpu_job("a", annotations={"chamber.io/min-runtime-s": "1e400"}), "not a finite"),
    ("NaN checkpoint interval", gpu_job("a", annotations={"chamber.io/checkpoint-interval-s": "nan"}), "not a finite"),
    (
        "a century of grace",
        with_(gpu_job("a"), "spec.template.spec.terminationGracePeriodSeconds", 100 * 365 * 86400),
        "checkpoint_grace_s",
    ),
    (
        "an unknown kind",
        with_(with_(gpu_job("a"), "apiVersion", "example.com/v1"), "kind", "Workflow"),
        "not supported",
    ),
]


@pytest.mark.parametrize(("case", "job", "message"), REJECTIONS, ids=[c[0] for c in REJECTIONS])
def test_jobs_chamber_cannot_run_are_rejected_with_what_to_fix(case: str, job: dict[str, Any], message: str) -> None:
    with pytest.raises(Rejection, match=message):
        job_spec(job, largest_node_gpus=8)


def test_the_admission_patch_suspends_marks_and_is_idempotent() -> None:
    job = gpu_job("a")
    del job["metadata"]["labels"]
    job["metadata"]["labels"] = {"chamber.io/team": "nlp"}
    job["spec"]["suspend"] = False
    once = jsonpatch.apply_patch(job, admission_patch(job))
    assert once["spec"]["suspend"] is True
    assert once["metadata"]["labels"]["chamber.io/managed"] == "true"
    assert once["spec"]["template"]["spec"]["schedulerName"] == "chamber"
    assert jsonpatch.apply_patch(once, admission_patch(once)) == once


def test_outcomes_and_pod_readings() -> None:
    done = {"status": {"conditions": [{"type": "Complete", "status": "True"}]}}
    failed = {"status": {"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]}}
    assert job_outcome(done) == (True, "")
    assert job_outcome(failed) == (False, "BackoffLimitExceeded")
    assert job_outcome({"status": {"conditions": [{"type": "Suspended", "status": "True"}]}}) is None
    pod = {
        "metadata": {"annotations": {"batch.kubernetes.io/job-completion-index": "3"}},
        "status": {"containerStatuses": [{"state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}],
                   "conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}]},
    }  # fmt: skip
    assert replica_of(pod) == 3
    assert pod_exit(pod) == (137, "OOMKilled")
    assert pod_disrupted(pod) == "EvictionByEvictionAPI"


def test_odd_index_readings_neither_raise_nor_override_the_controllers() -> None:
    """Found by review: "²" is a digit to `str.isdigit` and raised in `int`, in the executor's progress and resync;
    a template's annotation of the replica-index key overrode the operator's label."""
    from chamber.common.kube.workloads import pod_attempt

    odd = {"metadata": {"annotations": {"batch.kubernetes.io/job-completion-index": "²", "chamber.io/attempt": "٣"}}}
    assert replica_of(odd) == 0
    assert pod_attempt(odd) is None
    key = "training.kubeflow.org/replica-index"
    both = {"metadata": {"labels": {"training.kubeflow.org/replica-type": "worker", key: "2"},
                         "annotations": {key: "0"}}}  # fmt: skip
    assert replica_of(both, {"worker": (1, 3)}) == 3


def jobset(*groups: tuple[str, int, int, int]) -> dict[str, Any]:
    """A JobSet of replicated Jobs (name, child Jobs, pods per child, GPUs per pod)."""
    rjobs = [
        {"name": name, "replicas": replicas, "template": {"spec": gpu_job(name, replicas=pods, gpus=gpus)["spec"]}}
        for name, replicas, pods, gpus in groups
    ]
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": "js", "labels": {"chamber.io/team": "nlp"}, "uid": "u"},
            "spec": {"replicatedJobs": rjobs}}  # fmt: skip


def test_a_jobset_is_one_gang_of_all_its_pods_in_a_stable_order() -> None:
    js = jobset(("driver", 1, 1, 8), ("workers", 2, 4, 8))
    spec = job_spec(js)
    assert (spec.replicas, spec.gpus_per_replica) == (9, 8)
    assert spec.workload is not None
    assert spec.workload.kind == "JobSet"
    layout = jobset_layout(js)
    assert layout == {"driver": (0, 1), "workers": (1, 4)}
    pod = {"metadata": {"labels": {"jobset.sigs.k8s.io/replicatedjob-name": "workers",
                                   "jobset.sigs.k8s.io/job-index": "1",
                                   "batch.kubernetes.io/job-completion-index": "2"}}}  # fmt: skip
    assert replica_of(pod, layout) == 1 + 1 * 4 + 2
    patched = jsonpatch.apply_patch(js, admission_patch(js))
    assert patched["spec"]["suspend"] is True
    schedulers = {r["template"]["spec"]["template"]["spec"]["schedulerName"] for r in patched["spec"]["replicatedJobs"]}
    assert schedulers == {"chamber"}


def test_a_jobset_whose_pods_ask_for_different_gpus_is_rejected() -> None:
    with pytest.raises(Rejection, match="same number of GPUs"):
        job_spec(jobset(("launcher", 1, 1, 0), ("workers", 2, 1, 8)))


def pytorchjob(workers: int, *, gpus: int = 8, master_gpus: int | None = None, masters: int = 1) -> dict[str, Any]:
    """A PyTorchJob of one Master and `workers` Workers (the Master with `master_gpus`, default `gpus`)."""

    def replica(replicas: int, gpus: int) -> dict[str, Any]:
        template = gpu_job("p", gpus=gpus)["spec"]["template"]
        return {"replicas": replicas, "restartPolicy": "OnFailure", "template": template}

    specs = {"Worker": replica(workers, gpus)}
    if masters:
        specs["Master"] = replica(masters, gpus if master_gpus is None else master_gpus)
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": "pt", "labels": {"chamber.io/team": "nlp", "chamber.io/priority": "research",
                                                  "chamber.io/pool": "h100"}, "uid": "u"},
            "spec": {"runPolicy": {"activeDeadlineSeconds": 3600}, "pytorchReplicaSpecs": specs}}  # fmt: skip


def test_a_pytorchjob_is_one_gang_of_its_master_then_its_workers() -> None:
    pj = pytorchjob(3)
    spec = job_spec(pj)
    assert (spec.replicas, spec.gpus_per_replica, spec.team, spec.priority, spec.pool) == (
        4,
        8,
        "nlp",
        "research",
        "h100",
    )
    assert spec.max_runtime_s == 3600, "runPolicy.activeDeadlineSeconds is the job's limit"
    assert spec.workload is not None
    assert (spec.workload.kind, spec.workload.api_version) == ("PyTorchJob", "kubeflow.org/v1")
    layout = pytorch_layout(pj)
    assert layout == workload_layout(pj) == {"master": (0, 1), "worker": (1, 1)}

    def pod(rtype: str, index: int) -> dict[str, Any]:
        return {"metadata": {"labels": {"training.kubeflow.org/replica-type": rtype,
                                        "training.kubeflow.org/replica-index": str(index)}}}  # fmt: skip

    assert [replica_of(pod("master", 0), layout)] + [replica_of(pod("worker", i), layout) for i in range(3)] == [
        0, 1, 2, 3,
    ]  # fmt: skip
    assert job_spec(pytorchjob(2, masters=0)).replicas == 2, "workers alone (no Master) are a gang too"
    assert workload_layout(gpu_job("a")) is None


PYTORCH_REJECTIONS = [
    ("different GPUs", pytorchjob(2, master_gpus=0), "same number of GPUs"),
    ("two masters", pytorchjob(2, masters=2), "one Master"),
    ("no workers", with_(pytorchjob(1), "spec.pytorchReplicaSpecs.Worker.replicas", 0), "at least 1"),
    ("an unknown replica type", with_(pytorchjob(1), "spec.pytorchReplicaSpecs.Launcher", {}), "only Master and"),
    ("no replica specs", with_(pytorchjob(1), "spec.pytorchReplicaSpecs", {}), "is empty"),
    ("pinned to a node",
     with_(pytorchjob(1), "spec.pytorchReplicaSpecs.Worker.template.spec.nodeName", "n1"), "nodeName is set"),
    ("more GPUs than the largest node", pytorchjob(1, gpus=16), "largest node has 8"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "job", "message"), PYTORCH_REJECTIONS, ids=[c[0] for c in PYTORCH_REJECTIONS])
def test_pytorchjobs_chamber_cannot_run_are_rejected_with_what_to_fix(
    case: str, job: dict[str, Any], message: str
) -> None:
    with pytest.raises(Rejection, match=message):
        job_spec(job, largest_node_gpus=8)


def test_the_pytorchjob_admission_patch_suspends_its_run_policy_and_is_idempotent() -> None:
    pj = pytorchjob(2)
    del pj["spec"]["runPolicy"]
    once = jsonpatch.apply_patch(pj, admission_patch(pj))
    assert once["spec"]["runPolicy"] == {"suspend": True}
    assert "suspend" not in once["spec"], "a PyTorchJob suspends through spec.runPolicy.suspend"
    assert once["metadata"]["labels"]["chamber.io/managed"] == "true"
    schedulers = {r["template"]["spec"]["schedulerName"] for r in once["spec"]["pytorchReplicaSpecs"].values()}
    assert schedulers == {"chamber"}
    assert jsonpatch.apply_patch(once, admission_patch(once)) == once
    kept = jsonpatch.apply_patch(pytorchjob(1), admission_patch(pytorchjob(1)))
    assert kept["spec"]["runPolicy"] == {"activeDeadlineSeconds": 3600, "suspend": True}


def test_a_pytorchjob_succeeds_or_fails_by_its_conditions() -> None:
    succeeded = {"status": {"conditions": [{"type": "Running", "status": "False"},
                                           {"type": "Succeeded", "status": "True"}]}}  # fmt: skip
    assert job_outcome(succeeded) == (True, "")
    failed = {"status": {"conditions": [{"type": "Failed", "status": "True", "reason": "PyTorchJobFailed"}]}}
    assert job_outcome(failed) == (False, "PyTorchJobFailed")
    assert job_outcome({"status": {"conditions": [{"type": "Running", "status": "True"}]}}) is None


def test_a_trainjob_is_one_gang_of_its_trainer_nodes_with_its_resources_per_node() -> None:
    tj = with_(trainjob("llm", nodes=4, gpus=4, priority="research"), "spec.activeDeadlineSeconds", 7200)
    tj["metadata"].update(namespace="ml", uid="u-9")
    spec = job_spec(tj, runtime=training_runtime(gpus=8, nodes=1, grace_s=40))
    assert (spec.name, spec.team, spec.priority, spec.replicas, spec.gpus_per_replica) == (
        "llm",
        "nlp",
        "research",
        4,
        4,
    )
    assert (spec.max_runtime_s, spec.checkpoint_grace_s, spec.image) == (7200, 40, "pytorch/pytorch")
    assert spec.workload is not None
    assert (spec.workload.kind, spec.workload.api_version, spec.workload.uid) == (
        "TrainJob", "trainer.kubeflow.org/v1alpha1", "u-9",
    )  # fmt: skip
    defaults = job_spec(trainjob("llm"), runtime=training_runtime(gpus=2, nodes=3))
    assert (defaults.replicas, defaults.gpus_per_replica) == (3, 2), "what the TrainJob leaves out, the runtime says"
    image = with_(trainjob("llm"), "spec.trainer.image", "me/train:1")
    assert job_spec(image, runtime=training_runtime()).image == "me/train:1"
    assert runtime_ref(trainjob("a")) == ("ClusterTrainingRuntime", "torch-chamber")
    assert runtime_ref(trainjob("a", runtime="r", runtime_kind="TrainingRuntime")) == ("TrainingRuntime", "r")


def _mpi(runtime: dict[str, Any]) -> dict[str, Any]:
    runtime["spec"]["mlPolicy"] = {"numNodes": 1, "mpi": {"numProcPerNode": 1}}
    return runtime


def _gpu_initializer(runtime: dict[str, Any]) -> dict[str, Any]:
    pod = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    pod["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    return runtime


TRAINJOB_REJECTIONS = [
    ("runtime missing", trainjob("a"), None, "does not exist: Chamber reads the GPUs per node"),
    ("runtime without schedulerName chamber", trainjob("a"), training_runtime(scheduler=None),
     "must say schedulerName: chamber"),
    ("no GPUs anywhere", trainjob("a"), training_runtime(gpus=0), "asks for no nvidia.com/gpu"),
    ("more GPUs than the largest node", trainjob("a", gpus=16), training_runtime(), "largest node has 8"),
    ("a runtime of another group", with_(trainjob("a"), "spec.runtimeRef.apiGroup", "example.com"),
     training_runtime(), "ClusterTrainingRuntime and TrainingRuntime only"),
    ("no runtimeRef", with_(trainjob("a"), "spec.runtimeRef", {}), training_runtime(), "runtimeRef.name is missing"),
    ("an MPI runtime", trainjob("a"), _mpi(training_runtime()), "MPI runtime"),
    ("an elastic runtime", trainjob("a"),
     with_(training_runtime(), "spec.mlPolicy.torch.elasticPolicy", {"minNodes": 1, "maxNodes": 4}), "elasticPolicy"),
    ("an initializer asking for GPUs", trainjob("a"), _gpu_initializer(training_runtime()),
     "GPUs for the trainer's nodes only"),
    ("no trainer step", trainjob("a"), with_(training_runtime(), "spec.template.spec.replicatedJobs", []),
     "exactly one trainer step"),
    ("dispatched by MultiKueue", with_(trainjob("a"), "spec.managedBy", "kueue.x-k8s.io/multikueue"),
     training_runtime(), "MultiKueue"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "job", "runtime", "message"), TRAINJOB_REJECTIONS,
                         ids=[c[0] for c in TRAINJOB_REJECTIONS])  # fmt: skip
def test_trainjobs_chamber_cannot_run_are_rejected_with_what_to_fix(
    case: str, job: dict[str, Any], runtime: dict[str, Any] | None, message: str
) -> None:
    with pytest.raises(Rejection, match=message):
        job_spec(job, largest_node_gpus=8, runtime=runtime)


def test_the_trainjob_admission_patch_suspends_it_and_is_idempotent() -> None:
    tj = trainjob("llm", nodes=2, gpus=8)
    once = jsonpatch.apply_patch(tj, admission_patch(tj))
    assert once["spec"]["suspend"] is True
    assert once["metadata"]["labels"]["chamber.io/managed"] == "true"
    assert once["spec"]["trainer"] == tj["spec"]["trainer"], "spec.trainer is immutable: the patch leaves it alone"
    assert jsonpatch.apply_patch(once, admission_patch(once)) == once


def test_the_trainers_jobset_is_laid_out_by_its_trainer_step_only() -> None:
    runtime = training_runtime()
    jobset = {"spec": runtime["spec"]["template"]["spec"]}
    jobset["spec"]["replicatedJobs"][1]["template"]["spec"]["parallelism"] = 3
    layout = trainer_layout(jobset)
    assert layout == {"node": (0, 3)}

    def pod(rjob: str, index: int) -> dict[str, Any]:
        return {"metadata": {"labels": {"jobset.sigs.k8s.io/replicatedjob-name": rjob,
                                        "jobset.sigs.k8s.io/job-index": "0",
                                        "batch.kubernetes.io/job-completion-index": str(index)}}}  # fmt: skip

    assert [replica_of(pod("node", i), layout) for i in range(3)] == [0, 1, 2]
    complete = {"status": {"conditions": [{"type": "Complete", "status": "True", "reason": "JobsCompleted"}]}}
    assert job_outcome(complete) == (True, "")


def test_the_trainjob_example_is_one_chamber_can_run() -> None:
    example = Path(__file__).parents[3] / "deploy" / "examples" / "trainjob.yaml"
    runtime, tj = yaml.safe_load_all(example.read_text())
    spec = job_spec(tj, runtime=runtime, largest_node_gpus=8)
    assert (spec.team, spec.replicas, spec.gpus_per_replica, spec.checkpoint_grace_s) == ("nlp", 2, 8, 120)
    assert spec.topology is not None
    assert (spec.topology.level, spec.topology.required) == ("rack", True)
