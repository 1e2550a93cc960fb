"""The cluster behind the emulated API server: nodes from the simulated fleet, and the parts a real cluster's
controllers play, played here so a Job runs end to end without a cluster.

- **Nodes**: one Kubernetes node per simulated node (same names as the collector's simulated telemetry), with
  allocatable `nvidia.com/gpu`, GPU Feature Discovery labels, zone and rack labels and a `providerID`.
- **JobSet controller** (`jobset.x-k8s.io/v1alpha2`): one child Job per replica of each replicated Job
  (`<jobset>-<replicated job>-<index>`, labelled as JobSet labels them), suspended and resumed with the JobSet (the
  pod template's labels and annotations follow it), and `Completed` / `Failed` from its children.
- **PyTorchJob controller** (Kubeflow's `kubeflow.org/v1`): one pod per replica of its Master and Workers
  (`<name>-master-0`, `<name>-worker-<i>`, labelled `training.kubeflow.org/replica-type` and `replica-index` as the
  training operator labels them) while `spec.runPolicy.suspend` is false, deleted when it is true; `Succeeded` when
  every pod succeeded, `Failed` when one failed (not evicted).
- **Trainer controller** (Kubeflow Trainer v2's `trainer.kubeflow.org/v1alpha1`): a TrainJob gets a JobSet of
  its name, owned by it, built from the ClusterTrainingRuntime or TrainingRuntime it references (the trainer step
  gets `numNodes` pods, the `node` container `resourcesPerNode`, image, command and args), suspended while the
  TrainJob is, and `Complete` / `Failed` when that JobSet is. (There is no default scheduler here: a runtime's
  initializer steps would stay Pending, so the emulator's examples use runtimes without them.)
- **Job controller** (`batch/v1`): creates one pod per completion index while a Job is not suspended (owned by
  it, labelled as the real controller labels them), deletes its pods when it is suspended, recreates pods that
  were evicted, and marks the Job `Complete` or `Failed`.
- **Kubelets**: a pod bound to a node starts running; it ends after the `chamber.io/sim-duration-s` annotation's
  seconds with the `chamber.io/sim-exit-code` annotation's code (137 reads as `OOMKilled`), or runs until deleted;
  a deleted pod gets its termination grace period (capped by `grace_cap_s`, so demos stay short) before it goes.

It reconciles everything every `tick_s` (state-based, as controllers are), which is plenty for a demo fleet.
"""

import asyncio
import contextlib
import copy
import functools
import random
from collections.abc import Iterable
from typing import Any

from chamber.cli.kubesim.apiserver import ChamberKubeEmulator, now_rfc3339
from chamber.collector.core.simfleet import MEMORY_MB, FleetShape, SimulatedFleet
from chamber.common.kube import labels as L
from chamber.common.kube.workloads import (
    annotations_of,
    condition,
    is_trainer_step,
    labels_of,
    runtime_ref,
    runtime_replicated_jobs,
    timestamp,
    trainer_nodes,
    trainer_pod_spec,
)

Obj = dict[str, Any]
JOBS, PODS, NODES = "batch/v1/jobs", "/v1/pods", "/v1/nodes"
JOBSETS = "jobset.x-k8s.io/v1alpha2/jobsets"
PYTORCHJOBS = "kubeflow.org/v1/pytorchjobs"
TRAINJOBS = "trainer.kubeflow.org/v1alpha1/trainjobs"
RUNTIMES = {"ClusterTrainingRuntime": "trainer.kubeflow.org/v1alpha1/clustertrainingruntimes",
            "TrainingRuntime": "trainer.kubeflow.org/v1alpha1/trainingruntimes"}  # fmt: skip


def node_objects(shape: FleetShape, seed: int = 0) -> list[Obj]:
    """Kubernetes nodes for the simulated fleet (the collector's simulated telemetry uses the same names)."""
    fleet = SimulatedFleet(shape, seed=seed)
    nodes = []
    for i, node in enumerate(fleet.nodes):
        model = node.gpus[0].model if node.gpus else shape.gpu_model
        count = str(len(node.gpus))
        nodes.append({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": node.name, "labels": {
                "kubernetes.io/hostname": node.name, L.ZONE: node.topology.zone, "chamber.io/rack": node.topology.rack,
                L.GFD_PRODUCT: f"NVIDIA-{model}", L.GFD_MEMORY: str(MEMORY_MB.get(model, 0)), L.GFD_COUNT: count,
                L.GFD_MIG_CAPABLE: "false", L.POOL: node.pool,
            }},
            "spec": {"providerID": f"kind://emulated/chamber/{node.name}"},
            "status": {
                "capacity": {L.GPU_RESOURCE: count, "cpu": "96", "memory": "1024Gi", "pods": "110"},
                "allocatable": {L.GPU_RESOURCE: count, "cpu": "96", "memory": "1024Gi", "pods": "110"},
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
                "nodeInfo": {
                    "kubeletVersion": "v1.33.0-chamber-emulator", "kubeProxyVersion": "", "machineID": f"{i:032x}",
                    "systemUUID": f"{i:032x}", "bootID": f"{i:032x}", "architecture": "amd64",
                    "operatingSystem": "linux", "osImage": "Chamber emulated node", "kernelVersion": "6.1.0",
                    "containerRuntimeVersion": "containerd://1.7.0",
                },
            },
        })  # fmt: skip
    return nodes


def webhook_configurations(url: str) -> list[tuple[str, Obj]]:
    """Chamber's admission webhooks (the same rules as the Helm chart's), pointing at `url`."""
    rules = [
        {"operations": ["CREATE"], "apiGroups": ["batch"], "apiVersions": ["v1"], "resources": ["jobs"]},
        {
            "operations": ["CREATE"],
            "apiGroups": ["jobset.x-k8s.io"],
            "apiVersions": ["v1alpha2"],
            "resources": ["jobsets"],
        },
        {"operations": ["CREATE"], "apiGroups": ["kubeflow.org"], "apiVersions": ["v1"], "resources": ["pytorchjobs"]},
        {
            "operations": ["CREATE"],
            "apiGroups": ["trainer.kubeflow.org"],
            "apiVersions": ["v1alpha1"],
            "resources": ["trainjobs"],
        },
    ]
    hooks = []
    for suffix, label in (("team", L.TEAM), ("kueue", L.KUEUE_QUEUE)):
        hooks.append({
            "name": f"{suffix}.jobs.chamber.io", "rules": rules, "sideEffects": "None",
            "admissionReviewVersions": ["v1"], "failurePolicy": "Fail", "timeoutSeconds": 10,
            "objectSelector": {"matchExpressions": [{"key": label, "operator": "Exists"}]},
        })  # fmt: skip
    mutating = [dict(h, clientConfig={"url": f"{url}/mutate"}) for h in hooks]
    validating = [dict(h, clientConfig={"url": f"{url}/validate"}) for h in hooks]
    return [
        ("admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
         {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
          "metadata": {"name": "chamber"}, "webhooks": mutating}),
        ("admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
         {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
          "metadata": {"name": "chamber"}, "webhooks": validating}),
    ]  # fmt: skip


class EmulatedCluster:
    def __init__(self, api: ChamberKubeEmulator, *, tick_s: float = 0.1, grace_cap_s: float = 3.0) -> None:
        self.api = api
        self.tick_s = tick_s
        self.grace_cap_s = grace_cap_s
        self.loop_time = asyncio.get_running_loop().time
        self._started: dict[str, float] = {}
        """pod uid -> when its kubelet started it (loop time)."""
        self._deleting: dict[str, float] = {}
        """pod uid -> when its kubelet saw it deleted (loop time)."""
        self.kubelets_paused = False
        """Tests: bound pods stay Pending (a node whose kubelet hangs, an image that never pulls)."""

    def seed(self, nodes: Iterable[Obj], webhook_url: str = "") -> None:
        for node in nodes:
            self.api.create(NODES, node)
        if webhook_url:
            for rkey, obj in webhook_configurations(webhook_url):
                self.api.create(rkey, obj)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                self.reconcile()
            except Exception as exc:  # a controller bug must not take the API server down with it
                print(f"chamber kube-emulator: reconcile failed: {exc!r}", flush=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.tick_s)

    def reconcile(self) -> None:
        for trainjob in self.api.read_all(TRAINJOBS):
            self._trainjob(trainjob)
        jobs_by_owner: dict[str, list[Obj]] = {}
        for job in self.api.read_all(JOBS):
            jobs_by_owner.setdefault(labels_of(job).get(L.JOBSET_NAME, ""), []).append(job)
        for jobset in self.api.read_all(JOBSETS):
            self._jobset(jobset, jobs_by_owner.get(jobset["metadata"]["name"], []))
        pods = self.api.read_all(PODS)
        by_owner: dict[str, list[Obj]] = {}
        by_pytorchjob: dict[str, list[Obj]] = {}
        for pod in pods:
            by_owner.setdefault(labels_of(pod).get(L.CONTROLLER_UID, ""), []).append(pod)
            for ref in pod["metadata"].get("ownerReferences") or []:
                if ref.get("kind") == "PyTorchJob":
                    by_pytorchjob.setdefault(ref.get("uid", ""), []).append(pod)
        pytorchjobs = {pj["metadata"]["uid"]: pj for pj in self.api.read_all(PYTORCHJOBS)}
        for uid, pj in pytorchjobs.items():
            self._pytorchjob(pj, by_pytorchjob.get(uid, []))
        jobs = {job["metadata"]["uid"]: job for job in self.api.read_all(JOBS)}
        for uid, job in jobs.items():
            self._job(job, by_owner.get(uid, []))
        for pod in pods:
            owner = jobs.get(labels_of(pod).get(L.CONTROLLER_UID, ""))
            if owner is None:
                owner = next((pytorchjobs[r["uid"]] for r in pod["metadata"].get("ownerReferences") or []
                              if r.get("uid") in pytorchjobs), None)  # fmt: skip
            self._kubelet(pod, annotations_of(owner) if owner is not None else {})

    # ---- the JobSet controller -------------------------------------------------------------------------------

    def _jobset(self, jobset: Obj, children: list[Obj]) -> None:
        meta, spec = jobset["metadata"], jobset.get("spec") or {}
        ns, name = meta.get("namespace", "default"), meta["name"]
        mine = {c["metadata"]["name"]: c for c in children if _owned_by(c, meta["uid"])}
        if condition(jobset, "Completed") or condition(jobset, "Failed"):
            return
        suspend = bool(spec.get("suspend"))
        wanted = 0
        for rjob in spec.get("replicatedJobs") or []:
            template = rjob.get("template") or {}
            for index in range(int(rjob.get("replicas", 1))):
                wanted += 1
                child_name = f"{name}-{rjob['name']}-{index}"
                job_labels = {L.JOBSET_NAME: name, L.REPLICATED_JOB: rjob["name"], L.JOBSET_JOB_INDEX: str(index)}
                child_spec = copy.deepcopy(template.get("spec") or {})
                child_spec.setdefault("completionMode", "Indexed")
                pod_meta = child_spec.setdefault("template", {}).setdefault("metadata", {})
                pod_meta["labels"] = dict(pod_meta.get("labels") or {}, **job_labels)
                pod_meta["annotations"] = dict(pod_meta.get("annotations") or {}, **{L.JOBSET_JOB_INDEX: str(index)})
                child_spec["suspend"] = suspend
                current = mine.get(child_name)
                if current is None:
                    owner = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": name,
                             "uid": meta["uid"], "controller": True}  # fmt: skip
                    rjob_labels = (template.get("metadata") or {}).get("labels") or {}
                    child = {"apiVersion": "batch/v1", "kind": "Job", "spec": child_spec, "metadata": {
                        "name": child_name, "labels": dict(rjob_labels, **job_labels),
                        "annotations": dict(meta.get("annotations") or {}), "ownerReferences": [owner]}}  # fmt: skip
                    self.api.create(JOBS, child, ns)
                else:
                    self.api.update(JOBS, ns, child_name, functools.partial(_follow, spec=child_spec))
        finished = [c for c in mine.values() if condition(c, "Complete")]
        failed = [c for c in mine.values() if condition(c, "Failed")]
        if failed or (wanted and len(finished) >= wanted):
            kind, reason = ("Failed", "FailedJobs") if failed else ("Completed", "AllJobsCompleted")

            def done(js: Obj) -> Obj:
                status = js.setdefault("status", {})
                status["conditions"] = [*(status.get("conditions") or []), {
                    "type": kind, "status": "True", "reason": reason, "lastTransitionTime": now_rfc3339()}]  # fmt: skip
                return js

            self.api.update(JOBSETS, ns, name, done)

    # ---- the trainer controller (Kubeflow Trainer v2) ----------------------------------------------------------

    def _trainjob(self, tj: Obj) -> None:
        meta, spec = tj["metadata"], tj.get("spec") or {}
        ns, name = meta.get("namespace", "default"), meta["name"]
        if condition(tj, "Complete") or condition(tj, "Failed"):
            return
        suspend = bool(spec.get("suspend"))
        jobset = self.api.read(JOBSETS, ns, name)
        if jobset is None:
            kind, runtime_name = runtime_ref(tj)
            runtime = self.api.read(RUNTIMES[kind], ns if kind == "TrainingRuntime" else "", runtime_name)
            if runtime is not None:
                self.api.create(JOBSETS, _trainer_jobset(tj, runtime, suspend), ns)
            return
        if not _owned_by(jobset, meta["uid"]):
            return
        if bool((jobset.get("spec") or {}).get("suspend")) != suspend:

            def follow(js: Obj) -> Obj:
                js["spec"]["suspend"] = suspend
                return js

            self.api.update(JOBSETS, ns, name, follow)
        for kind, reason in (("Completed", "JobSetCompleted"), ("Failed", "JobSetFailed")):
            if condition(jobset, kind):
                mirrored = "Complete" if kind == "Completed" else "Failed"

                def done(current: Obj, mirrored: str = mirrored, reason: str = reason) -> Obj:
                    status = current.setdefault("status", {})
                    mark = {"type": mirrored, "status": "True", "reason": reason, "lastTransitionTime": now_rfc3339()}
                    status["conditions"] = [*(status.get("conditions") or []), mark]
                    return current

                self.api.update(TRAINJOBS, ns, name, done)

    # ---- the PyTorchJob controller (Kubeflow's training operator) --------------------------------------------

    def _pytorchjob(self, pj: Obj, pods: list[Obj]) -> None:
        meta, spec = pj["metadata"], pj.get("spec") or {}
        ns, name = meta.get("namespace", "default"), meta["name"]
        if condition(pj, "Succeeded") or condition(pj, "Failed"):
            return
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp") and _phase(p) in ("Pending", "Running")]
        if (spec.get("runPolicy") or {}).get("suspend"):
            for pod in live:
                self.api.delete_gracefully(PODS, ns, pod["metadata"]["name"])
            return
        wanted = {}
        for rtype, rspec in (spec.get("pytorchReplicaSpecs") or {}).items():
            for index in range(int(rspec.get("replicas", 1))):
                wanted[f"{name}-{rtype.lower()}-{index}"] = (rtype.lower(), index, rspec.get("template") or {})
        succeeded = {p["metadata"]["name"] for p in pods if _phase(p) == "Succeeded"}
        failed = [p for p in pods if _phase(p) == "Failed" and not condition(p, "DisruptionTarget")]
        if failed or (wanted and succeeded >= set(wanted)):
            for pod in live:
                self.api.delete_gracefully(PODS, ns, pod["metadata"]["name"])
            kind, reason = ("Failed", "PyTorchJobFailed") if failed else ("Succeeded", "PyTorchJobSucceeded")

            def done(current: Obj) -> Obj:
                status = current.setdefault("status", {})
                status["conditions"] = [*(status.get("conditions") or []), {
                    "type": kind, "status": "True", "reason": reason, "lastTransitionTime": now_rfc3339()}]  # fmt: skip
                return current

            self.api.update(PYTORCHJOBS, ns, name, done)
            return
        present = {p["metadata"]["name"] for p in live} | succeeded
        for pod_name, (rtype, index, tpl) in wanted.items():
            if pod_name in present or self.api.read(PODS, ns, pod_name) is not None:
                continue  # the old pod (evicted, or going) is removed before its replacement is made
            tpl_meta = tpl.get("metadata") or {}
            labels = dict(tpl_meta.get("labels") or {}, **{
                "training.kubeflow.org/job-name": name, "training.kubeflow.org/operator-name": "pytorchjob-controller",
                L.REPLICA_TYPE: rtype, L.REPLICA_INDEX: str(index),
            })  # fmt: skip
            owner = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": name, "uid": meta["uid"],
                     "controller": True, "blockOwnerDeletion": True}  # fmt: skip
            pod = {"apiVersion": "v1", "kind": "Pod", "spec": dict(tpl.get("spec") or {}),
                   "metadata": {"name": pod_name, "labels": labels, "ownerReferences": [owner],
                                "annotations": dict(tpl_meta.get("annotations") or {})}}  # fmt: skip
            self.api.create(PODS, pod, ns)

    # ---- the Job controller ----------------------------------------------------------------------------------

    def _job(self, job: Obj, pods: list[Obj]) -> None:
        if condition(job, "Complete") or condition(job, "Failed"):
            return
        meta, spec = job["metadata"], job.get("spec") or {}
        ns, _name = meta.get("namespace", "default"), meta["name"]
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp") and _phase(p) in ("Pending", "Running")]
        done = {_index(p) for p in pods if _phase(p) == "Succeeded"}
        failed = [p for p in pods if _phase(p) == "Failed" and not condition(p, "DisruptionTarget")]
        completions = int(spec.get("completions") or spec.get("parallelism") or 1)
        status: Obj = {"active": len(live), "succeeded": len(done), "failed": len(failed)}
        if spec.get("suspend"):
            for pod in live:
                self.api.delete_gracefully(PODS, ns, pod["metadata"]["name"])
            status["active"] = 0
            self._status(job, status, ("Suspended", "True", "JobSuspended", "Job suspended"), start=None)
            return
        start = (job.get("status") or {}).get("startTime") or now_rfc3339()
        if len(done) >= completions:
            for pod in live:
                self.api.delete_gracefully(PODS, ns, pod["metadata"]["name"])
            self._status(job, dict(status, completionTime=now_rfc3339()),
                         ("Complete", "True", "CompletionsReached", "Reached expected number of succeeded pods"),
                         start=start, extra=("SuccessCriteriaMet", "True", "CompletionsReached"))  # fmt: skip
            return
        if len(failed) > int(spec.get("backoffLimit", 6)):
            for pod in live:
                self.api.delete_gracefully(PODS, ns, pod["metadata"]["name"])
            failure = ("Failed", "True", "BackoffLimitExceeded", "Job has reached the specified backoff limit")
            self._status(job, status, failure, start=start, extra=("FailureTarget", "True", "BackoffLimitExceeded"))
            return
        running = {_index(p) for p in live}
        indexed = spec.get("completionMode") == "Indexed"
        for index in range(completions if indexed else max(0, int(spec.get("parallelism", 1)) - len(live))):
            if indexed and (index in running or index in done):
                continue
            self.api.create(PODS, self._pod(job, index if indexed else len(running) + index), ns)
        self._status(job, status, ("Suspended", "False", "JobResumed", "Job resumed"), start=start)

    def _pod(self, job: Obj, index: int) -> Obj:
        meta, tpl = job["metadata"], (job.get("spec") or {}).get("template") or {}
        tpl_meta = tpl.get("metadata") or {}
        labels = dict(tpl_meta.get("labels") or {}, **{
            L.CONTROLLER_UID: meta["uid"], "controller-uid": meta["uid"], L.JOB_NAME: meta["name"],
            "job-name": meta["name"], L.COMPLETION_INDEX: str(index),
        })  # fmt: skip
        annotations = dict(tpl_meta.get("annotations") or {}, **{L.COMPLETION_INDEX: str(index)})
        owner = {"apiVersion": "batch/v1", "kind": "Job", "name": meta["name"], "uid": meta["uid"],
                 "controller": True, "blockOwnerDeletion": True}  # fmt: skip
        return {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": f"{meta['name']}-{index}-", "labels": labels, "annotations": annotations,
                         "ownerReferences": [owner]},
            "spec": dict(tpl.get("spec") or {}),
        }  # fmt: skip

    def _status(
        self, job: Obj, counts: Obj, cond: tuple[str, str, str, str], *, start: str | None,
        extra: tuple[str, str, str] | None = None,
    ) -> None:  # fmt: skip
        def change(current: Obj) -> Obj:
            status = dict(current.get("status") or {}, **counts)
            if start is None:
                status.pop("startTime", None)
            else:
                status["startTime"] = start
            conditions = [
                c for c in status.get("conditions") or [] if c.get("type") not in (cond[0], (extra or ("",))[0])
            ]
            old = next((c for c in status.get("conditions") or [] if c.get("type") == cond[0]), None)
            if old is not None and old.get("status") == cond[1]:
                conditions.append(old)
            elif old is not None or cond[1] == "True":
                conditions.append({"type": cond[0], "status": cond[1], "reason": cond[2], "message": cond[3],
                                   "lastTransitionTime": now_rfc3339()})  # fmt: skip
            if extra is not None:
                conditions.insert(0, {"type": extra[0], "status": extra[1], "reason": extra[2],
                                      "lastTransitionTime": now_rfc3339()})  # fmt: skip
            status["conditions"] = conditions
            current["status"] = status
            return current

        meta = job["metadata"]
        self.api.update(JOBS, meta.get("namespace", "default"), meta["name"], change)

    # ---- kubelets ----------------------------------------------------------------------------------------------

    def _kubelet(self, pod: Obj, job_annotations: dict[str, str]) -> None:
        meta, spec = pod["metadata"], pod.get("spec") or {}
        ns, name, uid = meta.get("namespace", "default"), meta["name"], meta["uid"]
        node = spec.get("nodeName")
        now = self.loop_time()
        if meta.get("deletionTimestamp"):
            seen = self._deleting.setdefault(uid, now)
            grace = min(float(meta.get("deletionGracePeriodSeconds") or 0), self.grace_cap_s)
            if now - seen >= grace:
                self._deleting.pop(uid, None)
                self._started.pop(uid, None)
                with contextlib.suppress(Exception):
                    self.api.remove(PODS, ns, name)
            return
        if not node or self.api.read(NODES, "", node) is None:
            return
        phase = _phase(pod)
        if phase == "Pending" and not self.kubelets_paused:
            self._started[uid] = now
            self.api.update(PODS, ns, name, _run)
        elif phase == "Running":
            started = self._started.setdefault(uid, now)
            ann = dict(job_annotations, **annotations_of(pod))
            duration = ann.get(L.SIM_DURATION_S)
            if duration is not None and now - started >= float(duration):
                code = int(ann.get(L.SIM_EXIT_CODE, "0"))
                self._started.pop(uid, None)
                self.api.update(PODS, ns, name, lambda p: _end(p, code))


def _trainer_jobset(tj: Obj, runtime: Obj, suspend: bool) -> Obj:
    """The JobSet the trainer makes for a TrainJob from its runtime (what `jobset/builder.go` does)."""
    meta = tj["metadata"]
    rjobs = copy.deepcopy(runtime_replicated_jobs(runtime))
    nodes = trainer_nodes(tj, runtime)
    for rjob in rjobs:
        if is_trainer_step(rjob):
            rjob["replicas"] = 1
            job_spec = rjob.setdefault("template", {}).setdefault("spec", {})
            job_spec.update(parallelism=nodes, completions=nodes, completionMode="Indexed")
            job_spec.setdefault("template", {})["spec"] = trainer_pod_spec(tj, rjob)
    template_meta = ((runtime.get("spec") or {}).get("template") or {}).get("metadata") or {}
    owner = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": meta["name"],
             "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}  # fmt: skip
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
        "metadata": {"name": meta["name"], "labels": dict(template_meta.get("labels") or {}),
                     # the emulator's kubelets read chamber.io/sim-* from the owning Job, which copies these
                     "annotations": dict(template_meta.get("annotations") or {}, **annotations_of(tj)),
                     "ownerReferences": [owner]},
        "spec": {"suspend": suspend, "replicatedJobs": rjobs},
    }  # fmt: skip


def _owned_by(obj: Obj, uid: str) -> bool:
    return any(o.get("uid") == uid for o in obj["metadata"].get("ownerReferences") or [])


def _follow(job: Obj, *, spec: Obj) -> Obj:
    """A child Job follows its JobSet: suspended with it, and (while suspended or resuming) its pod template's
    labels and annotations."""
    job["spec"]["suspend"] = spec["suspend"]
    tpl_meta = job["spec"].setdefault("template", {}).setdefault("metadata", {})
    for key in ("labels", "annotations"):
        tpl_meta[key] = dict(spec["template"]["metadata"].get(key) or {})
    return job


def _phase(pod: Obj) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


def _index(pod: Obj) -> int:
    raw = labels_of(pod).get(L.COMPLETION_INDEX, "0")
    return int(raw) if raw.isdigit() else 0


def _containers(pod: Obj, state: Obj) -> list[Obj]:
    return [{"name": c.get("name", "main"), "state": state, "ready": "running" in state,
             "image": c.get("image", ""), "imageID": "", "restartCount": 0}
            for c in (pod.get("spec") or {}).get("containers") or [{}]]  # fmt: skip


def _run(pod: Obj) -> Obj:
    now = now_rfc3339()
    status = pod.setdefault("status", {})
    status.update(
        phase="Running",
        startTime=now,
        hostIP="10.0.0.1",
        podIP=f"10.1.{random.randint(0, 255)}.{random.randint(1, 254)}",
    )
    status["containerStatuses"] = _containers(pod, {"running": {"startedAt": now}})
    status["conditions"] = [c for c in status.get("conditions") or [] if c.get("type") != "Ready"] + [
        {"type": "Ready", "status": "True", "lastTransitionTime": now}
    ]
    return pod


def _end(pod: Obj, code: int) -> Obj:
    now = now_rfc3339()
    reason = "Completed" if code == 0 else "OOMKilled" if code == 137 else "Error"
    started = (pod.get("status") or {}).get("startTime")
    term = {"exitCode": code, "reason": reason, "startedAt": started, "finishedAt": now}
    pod["status"].update(phase="Succeeded" if code == 0 else "Failed")
    pod["status"]["containerStatuses"] = _containers(pod, {"terminated": term})
    return pod


def started_at(pod: Obj) -> float | None:
    return timestamp((pod.get("status") or {}).get("startTime"))
