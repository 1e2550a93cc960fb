"""The Kubernetes executor: a placed job's suspended Job is unsuspended and its pods bound where the ledger says.

- **Launch**: the Job gets the attempt and the placement on its pod template (`chamber.io/attempt`,
  `chamber.io/placement`, label `chamber.io/job-id`) and `suspend: false`; the Job controller creates one pod per
  replica (`schedulerName: chamber`, so no other scheduler touches them). When every replica's pod of the attempt
  exists, each is bound to its replica's node through the Binding API. All or none: nothing is bound until all
  pods are there, and if a binding fails the Job is suspended again (its pods go) and the launch reported failed.
- **Reports** (on `jobs.lifecycle.<job>`): `JobStarted` when every replica runs; `JobFinished` when the Job is
  `Complete` or `Failed` (exit code and `OOMKilled` from the pods); `JobStopped` when a stop finished (no pod of
  the attempt left that may hold a GPU: finished pods stay and do not count; bounded by the pods' grace period
  plus `STOP_MARGIN_S` from when the API took the suspend or delete, which is tried again every second while it
  refuses), or, interrupted, when a pod of a running attempt was evicted or its node failed, or a replacement pod
  of a running attempt could not be bound; `JobLaunchFailed` when the Job is gone, a binding failed, or the
  attempt was not running within `CHAMBER_KUBE_START_TIMEOUT_S` (the reason names the pods still pending), once
  the attempt's pods are gone.
- **Stop**: suspend the Job; the Job controller deletes its pods, which get SIGTERM and their
  `terminationGracePeriodSeconds` (the intake made that the job's checkpoint grace). A stop without grace (a
  failed GPU) also deletes the pods at once. A cancel deletes the Job; either way the stop is reported only once
  the terminating pods are gone (so the ledger never frees GPUs the kubelet still has assigned).

A JobSet or a PyTorchJob is run the same way: its pod templates get the attempt and it is unsuspended
(`spec.suspend` for a JobSet, `spec.runPolicy.suspend` for a PyTorchJob, which is also how it is suspended); its
pods are matched to replicas through the workload's layout (`workload_layout`).

A TrainJob (Kubeflow Trainer v2) has no pod template of its own: the trainer makes a JobSet of the same name from
its training runtime, suspended while the TrainJob is. At launch the executor puts the attempt on that JobSet's
trainer step (the replicated Job labelled `trainer.kubeflow.org/trainjob-ancestor-step: trainer`; JobSet allows
pod-template metadata changes while suspended) and unsuspends the TrainJob (`spec.suspend`, which is also how it
is suspended); the trainer resumes the JobSet, whose trainer pods (replica = completion index) are bound like any
JobSet's. The initializers' pods are not Chamber's (GPU-less, default scheduler).

The executor follows pods (label `chamber.io/job-id`) and managed Jobs with the reflector (list, watch, relist
on 410), so a restarted scheduler finds everything again; `resync` re-arms what the records say: a running
attempt whose workload finished meanwhile is reported finished, a repeated launch adopts the pods already there.
"""

import asyncio
import contextlib
import copy
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from chamber.common.bus import Bus
from chamber.common.bus.outbox import Outbox
from chamber.common.clock import Clock
from chamber.common.contracts import (
    JobFinished,
    JobLaunchFailed,
    JobRecord,
    JobStarted,
    JobState,
    JobStopped,
    WorkloadRef,
)
from chamber.common.kube import labels as L
from chamber.common.kube.client import JOBS, JOBSETS, PODS, PYTORCHJOBS, TRAINJOBS, KubeClient, Obj, Resource
from chamber.common.kube.errors import KubeConflict, KubeError, KubeNotFound
from chamber.common.kube.watch import Reflector
from chamber.common.kube.workloads import (
    is_trainer_step,
    job_id_for,
    job_outcome,
    labels_of,
    meta,
    pod_attempt,
    pod_disrupted,
    pod_exit,
    pytorch_replica_specs,
    replica_of,
    replicated_jobs,
    timestamp,
    trainer_layout,
    workload_layout,
)
from chamber.common.log import get_logger
from chamber.scheduler.core.lifecycle import grace_left

log = get_logger(__name__)
RESOURCES: dict[str, Resource] = {"Job": JOBS, "JobSet": JOBSETS, "PyTorchJob": PYTORCHJOBS, "TrainJob": TRAINJOBS}
"""The workload kinds the executor runs, by `WorkloadRef.kind`."""
LAID_OUT = ("JobSet", "PyTorchJob", "TrainJob")
"""Kinds whose pods are matched to replicas through a layout read from the cluster."""
TRAINER_JOBSET_WAIT_S = 15.0
"""How long a TrainJob's launch waits for the trainer to make its JobSet (it does so on the TrainJob's creation)."""
STOP_MARGIN_S = 30.0
"""How long past its pods' grace period a stop waits for them to go before it is reported anyway (a lost watch
event must not hold the job's GPUs forever)."""
DEFAULT_GRACE_S = 30.0
"""A pod's termination grace period when its spec names none."""
NO_WORKLOAD = (
    "no Kubernetes workload behind this job: with CHAMBER_EXECUTOR=kubernetes, submit a batch/v1 Job, a JobSet, a "
    "PyTorchJob or a TrainJob labelled chamber.io/team (docs/kubernetes.md)"
)
Event = JobStarted | JobFinished | JobStopped | JobLaunchFailed


@dataclass
class Attempt:
    record: JobRecord
    nodes: list[str]
    """The node of each replica, by completion index."""
    launched_at: float
    started: bool = False
    binding: bool = False
    stopping: str = ""
    """Why it is being stopped; empty while it is not."""
    stopping_since: float = 0.0
    """When the stop took hold (its bound is the pods' grace period plus `STOP_MARGIN_S` from then)."""
    halted: bool = False
    """The API took the stop: the workload is suspended (deleted, for a cancel) and, unless graceful, its pods are
    being deleted at once. Until then its pods may run on, so a stop is never taken as done by its clock alone."""
    halted_once: bool = False
    """The stop's clock started (when the API first took it; a later, stronger stop keeps that clock)."""
    deleting: bool = False
    """The stop deletes the workload (a cancel) instead of suspending it."""
    failing: str = ""
    """Set when the stop undoes a launch: once the pods are gone, JobLaunchFailed with this reason is reported."""
    graceful: bool = True
    interrupted: bool = False
    """Stopped by a failure (a pod evicted, its node gone), not on request."""
    pods: dict[str, Obj] = field(default_factory=dict)
    """uid -> the attempt's pods as last seen."""
    bound: set[str] = field(default_factory=set)
    """Pods this executor bound (their update may not have been seen yet)."""
    done: bool = False
    layout: dict[str, tuple[int, int]] | None = None
    """A JobSet's or a PyTorchJob's replica layout (see `workload_layout`); None for a Job."""

    @property
    def key(self) -> tuple[str, int]:
        return self.record.id, self.record.attempt


def replica_nodes(record: JobRecord) -> list[str]:
    """The node of each replica: a placement lists the gang's GPUs replica by replica."""
    if record.placement is None:
        return []
    per = record.spec.gpus_per_replica
    gpus = record.placement.gpus
    return [gpus[r * per].node for r in range(record.spec.replicas) if r * per < len(gpus)]


class KubernetesExecutor:
    def __init__(
        self, bus: Bus, clock: Clock, client: KubeClient, *, start_timeout_s: float = 120.0,
        lead_fresh: Callable[[], bool] | None = None,
    ) -> None:  # fmt: skip
        self.bus = bus
        self.clock = clock
        self.client = client
        self.start_timeout_s = start_timeout_s
        self.lead_fresh = lead_fresh
        """False while this scheduler's lease was not confirmed lately: it then undoes no launch on its own
        judgement (a start deadline), since another leader may run that attempt now (found by review)."""
        self.attempts: dict[str, Attempt] = {}
        """job id -> its current attempt."""
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._reports = Outbox(bus, "kube_executor")
        """Reports JetStream did not store (NATS away), published again every second (`_deadlines`)."""
        self._pods: Reflector | None = None
        self._pods_by_job: dict[str, dict[str, Obj]] = {}
        """Chamber's pods as the pod reflector has them, by job (job id -> uid -> pod): a launch or a progress
        looks at its job's pods only, not at every pod of the cluster (at 10,000 pods that scan was per event)."""
        self._workloads: dict[str, Reflector] = {}
        """resource plural -> the reflector of the managed workloads of that kind."""

    # ---- the Executor protocol ------------------------------------------------------------------------------

    async def launch(self, record: JobRecord) -> None:
        await self._ensure_started()
        ref = record.spec.workload
        if ref is None or ref.kind not in RESOURCES:
            await self._fail(record, NO_WORKLOAD)
            return
        nodes = replica_nodes(record)
        attempt = Attempt(record, nodes, self.clock.now())
        self.attempts[record.id] = attempt
        self._adopt_pods(attempt)  # a launch repeated by resync: its pods may exist already (bound or not)
        template_meta = {
            "labels": {L.JOB_ID: record.id},
            "annotations": {L.ATTEMPT: str(record.attempt), L.PLACEMENT: ",".join(nodes)},
        }
        try:
            if ref.kind == "JobSet":
                jobset = _same(await self.client.get(JOBSETS, ref.name, ref.namespace), ref)
                attempt.layout = workload_layout(jobset)
                await self.client.patch(JOBSETS, ref.name, _with_uid(_unsuspend_jobset(jobset, template_meta), ref),
                                        ref.namespace)  # fmt: skip
            elif ref.kind == "PyTorchJob":
                pytorchjob = _same(await self.client.get(PYTORCHJOBS, ref.name, ref.namespace), ref)
                attempt.layout = workload_layout(pytorchjob)
                await self.client.patch(PYTORCHJOBS, ref.name,
                                        _with_uid(_unsuspend_pytorchjob(pytorchjob, template_meta), ref),
                                        ref.namespace)  # fmt: skip
            elif ref.kind == "TrainJob":
                attempt.layout = await self._launch_trainjob(record, template_meta)
            else:
                patch = {"spec": {"suspend": False, "template": {"metadata": template_meta}}}
                await self.client.patch(JOBS, ref.name, _with_uid(patch, ref), ref.namespace)
        except _NotReady as exc:
            await self._fail(record, str(exc))
            return
        except (KubeNotFound, _Replaced):
            await self._fail(record, f"the Job {ref.namespace}/{ref.name} is gone")
            return
        except KubeConflict as exc:  # (a UID precondition: another workload of the name; or a concurrent change)
            await self._fail(record, f"the Job {ref.namespace}/{ref.name} is gone or changed meanwhile: {exc}")
            return
        except KubeError as exc:
            await self._fail(record, f"could not unsuspend {ref.namespace}/{ref.name}: {exc}")
            return
        log.info("kube_executor.launched", job_id=record.id, attempt=record.attempt, nodes=nodes)
        await self._progress(attempt)

    async def _launch_trainjob(self, record: JobRecord, template_meta: Obj) -> dict[str, tuple[int, int]]:
        """Put the attempt on the trainer's JobSet (its trainer step), then unsuspend the TrainJob."""
        ref = record.spec.workload
        assert ref is not None
        _same(await self.client.get(TRAINJOBS, ref.name, ref.namespace), ref)  # gone: reported as such
        jobset: Obj | None = None
        waited = 0.0
        while jobset is None:  # the trainer makes it as soon as it sees the TrainJob, which may be after us
            try:
                jobset = await self.client.get(JOBSETS, ref.name, ref.namespace)
            except KubeNotFound:
                if waited >= min(self.start_timeout_s, TRAINER_JOBSET_WAIT_S):
                    raise _NotReady(
                        f"the trainer made no JobSet for TrainJob {ref.namespace}/{ref.name} within {waited:g} s (is "
                        "the Kubeflow trainer controller running?)"
                    ) from None
                await asyncio.sleep(0.25)
                waited += 0.25
        if not any(o.get("uid") == ref.uid for o in meta(jobset).get("ownerReferences") or []):
            raise _NotReady(f"the JobSet {ref.namespace}/{ref.name} is not this TrainJob's (a namesake's, going)")
        layout = trainer_layout(jobset)
        if not layout:
            raise _NotReady(f"the JobSet {ref.namespace}/{ref.name} has no trainer step")
        await self.client.patch(JOBSETS, ref.name, _jobset_patch(jobset, template_meta, trainer_only=True),
                                ref.namespace)  # fmt: skip
        await self.client.patch(TRAINJOBS, ref.name, _with_uid({"spec": {"suspend": False}}, ref), ref.namespace)
        return layout

    async def stop(self, record: JobRecord, reason: str, grace_s: float = 0.0) -> None:
        await self._ensure_started()
        attempt = self.attempts.get(record.id)
        if attempt is None or attempt.record.attempt != record.attempt:
            attempt = Attempt(record, replica_nodes(record), self.clock.now(), started=record.state == JobState.RUNNING)
            self.attempts[record.id] = attempt
            self._adopt_pods(attempt)
        if not attempt.stopping:
            attempt.stopping_since = self.clock.now()
        if (record.cancel_requested and not attempt.deleting) or (attempt.graceful and grace_s <= 0):
            attempt.halted = False  # more to do than the stop the API took (delete it, or its pods at once)
        attempt.stopping = reason or "stopped"
        attempt.graceful = grace_s > 0
        attempt.deleting = attempt.deleting or record.cancel_requested
        ref = record.spec.workload
        if ref is None or ref.kind not in RESOURCES:
            await self._stopped(attempt)
            return
        await self._halt(attempt)
        await self._progress(attempt)

    async def _halt(self, attempt: Attempt) -> None:
        """Suspend the attempt's workload (delete it, for a cancel) and, unless the stop is graceful, delete its
        pods at once. A refusal (throttled, unavailable, timed out) is tried again every second by `_deadlines`:
        the stop is not taken as done while the workload may still run, and its clock starts when this succeeds."""
        ref = attempt.record.spec.workload
        if ref is None or ref.kind not in RESOURCES:
            return
        try:
            gone = False
            try:
                if attempt.deleting:
                    await self.client.delete(RESOURCES[ref.kind], ref.name, ref.namespace, propagation="Background",
                                             uid=ref.uid)  # fmt: skip
                else:
                    await self._suspend(attempt)
            except (KubeNotFound, KubeConflict):  # (a conflict: the UID precondition, another workload of the name)
                # The workload is gone already. Its pods go with it, unless it was deleted orphaning them
                # (`--cascade=orphan`): they are deleted here too (found by review: they ran on, on GPUs the ledger
                # had released). The stop ends when they are gone.
                gone = True
            if not attempt.graceful or gone:
                for pod in list(attempt.pods.values()):
                    with contextlib.suppress(KubeNotFound):
                        # Never a grace of 0: that removes the pod from the API at once, while the kubelet still
                        # runs its containers for their grace (found by review: the stop was reported, and the GPUs
                        # released, with the containers running). 1 s is `kubectl delete --now`.
                        await self.client.delete(PODS, meta(pod)["name"], ref.namespace,
                                                 grace_s=None if attempt.graceful else 1)  # fmt: skip
        except KubeError as exc:
            log.warning("kube_executor.stop_failed", job_id=attempt.record.id, error=str(exc), retry_in_s=1)
            return
        if not attempt.halted:
            attempt.halted = True
            if not attempt.halted_once:
                attempt.halted_once = True
                attempt.stopping_since = self.clock.now()

    async def resync(self, records: Iterable[JobRecord]) -> None:
        await self._ensure_started()
        for record in records:
            if record.placement is None:
                continue
            if record.cancel_requested:
                await self.stop(record, "cancelled")
            elif record.stopping:
                await self.stop(record, record.stop_reason, grace_left(record, self.clock.now()))
            elif record.state == JobState.RUNNING:
                attempt = Attempt(record, replica_nodes(record), self.clock.now(), started=True)
                self.attempts[record.id] = attempt
                ref = record.spec.workload
                if ref is not None and ref.kind in LAID_OUT:
                    with contextlib.suppress(KubeError):
                        if ref.kind == "TrainJob":
                            attempt.layout = trainer_layout(await self.client.get(JOBSETS, ref.name, ref.namespace))
                        else:
                            workload = await self.client.get(RESOURCES[ref.kind], ref.name, ref.namespace)
                            attempt.layout = workload_layout(workload)
                self._adopt_pods(attempt)
                outcome = self._cached_outcome(record)
                if outcome is not None:  # it completed or failed while the scheduler was down
                    await self._finished(attempt, *outcome)
                    continue
                if self._cached_suspended(record):
                    # Running, yet suspended: only a stop suspends a running workload, so it was being stopped
                    # (interrupted: a pod evicted or lost) when the last leader went, before the stop was reported.
                    attempt.stopping = "interrupted while the scheduler was away (its workload is suspended)"
                    attempt.stopping_since = self.clock.now()
                    attempt.graceful = False
                    attempt.interrupted = True
                    await self._halt(attempt)
                await self._progress(attempt)
            else:
                await self.launch(record)

    async def close(self) -> None:
        self._stop.set()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.client.close()

    # ---- following the cluster ---------------------------------------------------------------------------------

    async def _ensure_started(self) -> None:
        if self._pods is not None:
            return
        self._pods = Reflector(self.client, PODS, self._on_pod, labels=L.JOB_ID, name="pods")
        self._workloads[JOBS.plural] = Reflector(
            self.client, JOBS, self._on_job, labels=f"{L.MANAGED}=true", name="jobs"
        )
        for crd in (JOBSETS, PYTORCHJOBS, TRAINJOBS):
            if await self.client.serves(crd):
                self._workloads[crd.plural] = Reflector(
                    self.client, crd, self._on_job, labels=f"{L.MANAGED}=true", name=crd.plural
                )
        reflectors = [self._pods, *self._workloads.values()]
        self._tasks = [asyncio.create_task(r.run(self._stop)) for r in reflectors]
        self._tasks.append(asyncio.create_task(self._deadlines()))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*(r.synced.wait() for r in reflectors)), timeout=10)

    def _adopt_pods(self, attempt: Attempt) -> None:
        for pod in self._pods_by_job.get(attempt.record.id, {}).values():
            if pod_attempt(pod) == attempt.record.attempt:
                attempt.pods[meta(pod)["uid"]] = pod

    def _cached_workload(self, record: JobRecord) -> Obj | None:
        """The job's workload as its reflector last saw it (None: not seen)."""
        ref = record.spec.workload
        reflector = (
            self._workloads.get(RESOURCES[ref.kind].plural) if ref is not None and ref.kind in RESOURCES else None
        )
        if ref is None or reflector is None:
            return None
        return next((obj for obj in reflector.objects.values() if meta(obj).get("uid") == ref.uid), None)

    def _cached_outcome(self, record: JobRecord) -> tuple[bool, str] | None:
        """The workload's outcome as the reflector last saw it (None: not finished, or not seen)."""
        workload = self._cached_workload(record)
        return job_outcome(workload) if workload is not None else None

    def _cached_suspended(self, record: JobRecord) -> bool:
        """Whether the workload is suspended, as its reflector last saw it."""
        workload = self._cached_workload(record)
        if workload is None:
            return False
        spec = workload.get("spec") or {}
        return bool((spec.get("runPolicy") or {}).get("suspend") if "runPolicy" in spec else spec.get("suspend"))

    async def _on_pod(self, kind: str, pod: Obj) -> None:
        job_id = labels_of(pod).get(L.JOB_ID, "")
        uid = meta(pod)["uid"]
        of_job = self._pods_by_job.setdefault(job_id, {})
        if kind == "DELETED":
            of_job.pop(uid, None)
            if not of_job:
                del self._pods_by_job[job_id]
        else:
            of_job[uid] = pod
        attempt = self.attempts.get(job_id)
        if attempt is None or pod_attempt(pod) != attempt.record.attempt:
            return
        if kind == "DELETED":
            attempt.pods.pop(uid, None)
        else:
            attempt.pods[uid] = pod
        if kind == "DELETED" or pod_disrupted(pod):
            await self._maybe_interrupted(attempt, pod)
        await self._progress(attempt)

    async def _on_job(self, kind: str, job: Obj) -> None:
        attempt = self.attempts.get(job_id_for(str(meta(job).get("uid") or "")))
        ref = attempt.record.spec.workload if attempt is not None else None
        if attempt is None or ref is None or ref.uid != meta(job).get("uid"):
            return
        if kind == "DELETED":
            if not attempt.started and not attempt.stopping:
                # its pods are deleted gracefully: the failure is reported once they are gone
                self._begin_undo(attempt, f"the Job {ref.namespace}/{ref.name} was deleted")
                await self._progress(attempt)
            return
        outcome = job_outcome(job)
        if outcome is not None and not attempt.done:
            await self._finished(attempt, *outcome)

    async def _maybe_interrupted(self, attempt: Attempt, pod: Obj) -> None:
        """A pod of a running attempt was evicted or lost while nobody asked: the attempt is interrupted."""
        why = pod_disrupted(pod)
        if attempt.stopping or attempt.done or not attempt.started or not why:
            return
        attempt.stopping = f"pod {meta(pod)['name']} on {pod.get('spec', {}).get('nodeName')}: {why}"
        attempt.stopping_since = self.clock.now()
        attempt.graceful = False
        attempt.interrupted = True
        await self._halt(attempt)

    # ---- moving an attempt along --------------------------------------------------------------------------------

    async def _progress(self, attempt: Attempt) -> None:
        if attempt.done:
            return
        if attempt.stopping:
            if not any(_holding(p) for p in attempt.pods.values()):  # finished pods stay, holding nothing
                await self._stopped(attempt)
            return
        replicas = attempt.record.spec.replicas
        live = [p for p in attempt.pods.values() if not meta(p).get("deletionTimestamp")]
        unbound = [p for p in live if not (p.get("spec") or {}).get("nodeName") and meta(p)["uid"] not in attempt.bound]
        ref = attempt.record.spec.workload
        if ref is not None and ref.kind in LAID_OUT and attempt.layout is None:
            return  # its replica layout is read at launch and on resync; without it no pod can be bound
        indexes = {replica_of(p, attempt.layout) for p in live}
        needed = set(range(replicas)) - self._completed_indexes(attempt)
        if unbound and not attempt.binding and indexes >= needed:
            await self._bind(attempt, unbound)
            if _undoing(attempt):  # the binding failed: the launch is being undone
                return
        running = [p for p in live if (p.get("status") or {}).get("phase") == "Running"]
        if not attempt.started and needed and {replica_of(p, attempt.layout) for p in running} >= needed:
            attempt.started = True
            starts = [t for p in running if (t := timestamp((p.get("status") or {}).get("startTime")))]
            started_at = max(starts) if starts else self.clock.now()
            await self._report(attempt.record, JobStarted(job_id=attempt.record.id, attempt=attempt.record.attempt,
                                                          started_at=started_at), "started")  # fmt: skip

    def _completed_indexes(self, attempt: Attempt) -> set[int]:
        """The replicas that succeeded in an earlier attempt of a Job (its completion indexes), or of a JobSet or a
        TrainJob (a child Job that completed): their controllers do not make them again when the workload is
        resumed, so the relaunch waits for (and runs) only the others (found by review: a JobSet resumed after one
        of its replicated Jobs completed waited for that Job's pods until its start deadline, every attempt)."""
        ref = attempt.record.spec.workload
        if ref is None or ref.kind not in ("Job", "JobSet", "TrainJob"):
            return set()
        if ref.kind != "Job" and attempt.layout is None:
            return set()
        return {
            replica_of(p, None if ref.kind == "Job" else attempt.layout)
            for p in self._pods_by_job.get(attempt.record.id, {}).values()
            if (pod_attempt(p) or 0) < attempt.record.attempt and (p.get("status") or {}).get("phase") == "Succeeded"
        }

    async def _bind(self, attempt: Attempt, pods: list[Obj]) -> None:
        """Bind every replica's pod to its node, all together; any failure undoes the launch."""
        attempt.binding = True
        try:
            for pod in pods:
                index = replica_of(pod, attempt.layout)
                if index >= len(attempt.nodes):
                    raise KubeConflict(f"pod {meta(pod)['name']} has index {index} beyond the placement")
            await asyncio.gather(*(self._bind_one(attempt, p) for p in pods))
            log.info("kube_executor.bound", job_id=attempt.record.id, pods=len(pods))
        except KubeError as exc:
            await self._undo(attempt, f"binding failed: {exc}")
        finally:
            attempt.binding = False

    async def _bind_one(self, attempt: Attempt, pod: Obj) -> None:
        node = attempt.nodes[replica_of(pod, attempt.layout)]
        try:
            await self.client.bind(meta(pod)["namespace"], meta(pod)["name"], node, meta(pod)["uid"])
        except KubeConflict:
            current = await self.client.get(PODS, meta(pod)["name"], meta(pod)["namespace"])
            if (current.get("spec") or {}).get("nodeName") != node:  # bound elsewhere, or a new pod: fail
                raise
        attempt.bound.add(meta(pod)["uid"])

    async def _undo(self, attempt: Attempt, reason: str) -> None:
        """Suspend the Job again; the launch is reported failed once its pods are gone (or the stop's bound)."""
        self._begin_undo(attempt, reason)
        await self._halt(attempt)
        await self._progress(attempt)

    def _begin_undo(self, attempt: Attempt, reason: str) -> None:
        """Stop the attempt without grace: a launch that did not come about ends as a launch failure; one that had
        started (a replacement pod that could not be bound) as an interruption, requeued like any."""
        attempt.stopping = reason
        if attempt.started:
            attempt.interrupted = True
        else:
            attempt.failing = reason
        attempt.stopping_since = self.clock.now()
        attempt.graceful = False

    async def _suspend(self, attempt: Attempt) -> None:
        ref = attempt.record.spec.workload
        if ref is not None and ref.kind in RESOURCES:
            patch: Obj = {"spec": {"suspend": True}}
            if ref.kind == "PyTorchJob":
                patch = {"spec": {"runPolicy": {"suspend": True}}}
            await self.client.patch(RESOURCES[ref.kind], ref.name, _with_uid(patch, ref), ref.namespace)

    async def _deadlines(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), timeout=1.0)
            await self._reports.flush()
            now = self.clock.now()
            for attempt in list(self.attempts.values()):
                if attempt.done:
                    continue
                if attempt.stopping:
                    if not attempt.halted:
                        await self._halt(attempt)
                    elif now - attempt.stopping_since > _grace_of(attempt) + STOP_MARGIN_S:
                        log.warning("kube_executor.stop_unconfirmed", job_id=attempt.record.id,
                                    pods=[meta(p)["name"] for p in attempt.pods.values() if _holding(p)])  # fmt: skip
                        await self._stopped(attempt)
                    continue
                if attempt.started:
                    continue
                if now - attempt.launched_at > self.start_timeout_s and (self.lead_fresh is None or self.lead_fresh()):
                    await self._undo(attempt, f"not running within {self.start_timeout_s:g} s: {_pending(attempt)}")

    async def _finished(self, attempt: Attempt, succeeded: bool, message: str) -> None:
        attempt.done = True
        code, reason = None, ""
        for pod in attempt.pods.values():
            code, reason = pod_exit(pod)
            if code:
                break
        if code:
            message = "; ".join(p for p in (reason, f"exit code {code}", message) if p)
        record = attempt.record
        event = JobFinished(job_id=record.id, attempt=record.attempt, finished_at=self.clock.now(), succeeded=succeeded,
                            message=message, exit_code=code, started_at=record.started_at)  # fmt: skip
        await self._report(record, event, "finished")
        self.attempts.pop(record.id, None)

    async def _stopped(self, attempt: Attempt) -> None:
        attempt.done = True
        record = attempt.record
        if attempt.failing:
            await self._fail(record, attempt.failing)
            return
        event = JobStopped(job_id=record.id, attempt=record.attempt, stopped_at=self.clock.now(),
                           reason=attempt.stopping, graceful=attempt.graceful, started_at=record.started_at,
                           interrupted=attempt.interrupted)  # fmt: skip
        await self._report(record, event, "stopped")
        self.attempts.pop(record.id, None)

    async def _fail(self, record: JobRecord, reason: str) -> None:
        log.warning("kube_executor.launch_failed", job_id=record.id, attempt=record.attempt, reason=reason)
        event = JobLaunchFailed(job_id=record.id, attempt=record.attempt, failed_at=self.clock.now(), reason=reason)
        await self._report(record, event, "launch-failed")
        if (a := self.attempts.get(record.id)) is not None and a.record.attempt == record.attempt:
            self.attempts.pop(record.id, None)

    async def _report(self, record: JobRecord, event: Event, what: str) -> None:
        """Publish a report (see `Outbox`): a dropped one would leave its job running or stopping, its GPUs held,
        until the scheduler restarted (the attempt is already forgotten here)."""
        await self._reports.publish(self.bus.names.job_lifecycle(record.id), event,
                                    f"{record.id}:{record.attempt}:{what}", retry_delays=(0.5, 0.5))  # fmt: skip


class _NotReady(KubeError):
    """The workload is not in a state a launch can start from (reported as the launch's failure reason)."""


def _unsuspend_jobset(jobset: Obj, template_meta: Obj) -> Obj:
    """Merge patch that resumes a JobSet with the attempt on every replicated Job's pod template."""
    patch = _jobset_patch(jobset, template_meta)
    patch["spec"]["suspend"] = False
    return patch


def _jobset_patch(jobset: Obj, template_meta: Obj, *, trainer_only: bool = False) -> Obj:
    """Merge patch that puts the attempt on a JobSet's replicated Jobs' pod templates (only the trainer step's
    with `trainer_only`). Its `replicatedJobs` is a list, which a merge patch replaces whole: the patch carries
    the whole list and the JobSet's resource version (a concurrent change is a conflict, never a lost edit)."""
    rjobs = []
    for rjob in replicated_jobs(jobset):
        new = copy.deepcopy(rjob)
        if not trainer_only or is_trainer_step(rjob):
            pod_meta = new.setdefault("template", {}).setdefault("spec", {}).setdefault("template", {})
            pod_meta = pod_meta.setdefault("metadata", {})
            for key in ("labels", "annotations"):
                pod_meta[key] = dict(pod_meta.get(key) or {}, **template_meta[key])
        rjobs.append(new)
    return {"metadata": {"resourceVersion": meta(jobset).get("resourceVersion")},
            "spec": {"replicatedJobs": rjobs}}  # fmt: skip


def _unsuspend_pytorchjob(pytorchjob: Obj, template_meta: Obj) -> Obj:
    """Merge patch that resumes a PyTorchJob (`spec.runPolicy.suspend: false`) with the attempt on every replica
    spec's pod template. `pytorchReplicaSpecs` is a map, so a merge patch adds to each template's metadata."""
    specs = {rtype: {"template": {"metadata": template_meta}} for rtype in pytorch_replica_specs(pytorchjob)}
    return {"spec": {"runPolicy": {"suspend": False}, "pytorchReplicaSpecs": specs}}


class _Replaced(Exception):
    """The workload of the name is another one (deleted and made again since the job was taken)."""


def _same(obj: Obj, ref: WorkloadRef) -> Obj:
    """`obj` if it is the workload `ref` names (its UID), else `_Replaced`."""
    if ref.uid and meta(obj).get("uid") != ref.uid:
        raise _Replaced(f"{ref.kind} {ref.namespace}/{ref.name} is another one now (uid {meta(obj).get('uid')})")
    return obj


def _with_uid(patch: Obj, ref: WorkloadRef) -> Obj:
    """The patch, applied only to the workload `ref` names: its `metadata.uid` is a precondition (the API server
    refuses it, 409, on another workload of the same name: found by review, a Job deleted and made again under its
    name was unsuspended, or deleted, for the job of the old one)."""
    if ref.uid:
        patch = dict(patch, metadata=dict(patch.get("metadata") or {}, uid=ref.uid))
    return patch


def _undoing(attempt: Attempt) -> bool:
    return attempt.done or bool(attempt.stopping)


def _holding(pod: Obj) -> bool:
    """Whether a pod may still hold its node's GPUs: not yet Succeeded or Failed (a finished pod stays, holding
    nothing; the Job controller deletes only active pods when the Job is suspended)."""
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


def _grace_of(attempt: Attempt) -> float:
    """The longest termination grace period among the attempt's pods still holding GPUs."""
    graces = [DEFAULT_GRACE_S]
    for pod in attempt.pods.values():
        if _holding(pod):
            grace = meta(pod).get("deletionGracePeriodSeconds")
            if grace is None:
                grace = (pod.get("spec") or {}).get("terminationGracePeriodSeconds")
            graces.append(float(grace if grace is not None else DEFAULT_GRACE_S))
    return max(graces)


def _pending(attempt: Attempt) -> str:
    """Why an attempt is not running yet, for the launch-failed reason."""
    if not attempt.pods:
        ref = attempt.record.spec.workload
        if ref is not None and ref.kind == "TrainJob":
            return (f"no trainer pod of TrainJob {ref.namespace}/{ref.name} yet (its initializers run first; see "
                    f"`kubectl describe trainjob,jobset {ref.name}`)")  # fmt: skip
        return "the Job controller created no pods (see `kubectl describe job`: quota, LimitRange, admission)"
    parts = []
    for pod in attempt.pods.values():
        status, node = pod.get("status") or {}, (pod.get("spec") or {}).get("nodeName")
        parts.append(f"{meta(pod)['name']} {status.get('phase', 'Pending')} {'on ' + node if node else '(unbound)'}")
    return "; ".join(parts[:5])
