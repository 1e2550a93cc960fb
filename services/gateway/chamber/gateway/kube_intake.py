"""Kubernetes intake: admission webhooks and the Job watcher that turn labelled Jobs into Chamber jobs.

Runs inside the gateway (the API edge) when `CHAMBER_KUBE_API` is set:

- **Mutating webhook** (`POST /mutate`): a Job labelled `chamber.io/team` (or Kueue's queue name) is suspended
  on creation, marked `chamber.io/managed=true`, and its pods get `schedulerName: chamber`, so no pod exists
  while it waits and none is placed by anyone but Chamber.
- **Validating webhook** (`POST /validate`): a Job Chamber cannot run is refused with the reason, which
  `kubectl apply` prints (`admission webhook "team.jobs.chamber.io" denied the request: ...`); so is one labelled
  with a team that takes workloads only from other namespaces (`TeamConfig.namespaces`, followed from the quota
  store): otherwise anyone who may create a Job could spend any team's quota by naming it.
- **TrainJob** (Kubeflow Trainer v2): it has no pod template, so the webhook only suspends and marks it; the
  GPUs per node, the node count where the TrainJob leaves it out, and the trainer's `schedulerName` come from the
  ClusterTrainingRuntime or TrainingRuntime its `spec.runtimeRef` names, which the validating webhook and the
  watcher read (a missing runtime, or one whose trainer pods are not `schedulerName: chamber`, is refused).
- **Watcher**: every managed Job (and JobSet, PyTorchJob and TrainJob, where their CRDs are installed) becomes
  `JobSubmitted` (its Chamber id is `k8s-<uid>`, so a repeat is the same job); a deleted one becomes
  `JobCancelRequested`. It lists, watches from the list's resource version, resumes after bookmarks and breaks,
  and lists again on `410 Gone`; after every list, active Chamber jobs whose workload no longer exists are
  cancelled, so a Job deleted while the gateway was down is not forgotten.
"""

import asyncio
import base64
import contextlib
import functools
import hashlib
import json
import os
import ssl
from collections.abc import Awaitable, Callable, Generator
from typing import Any

import uvicorn
from litestar import Litestar, get, post
from litestar.exceptions import ValidationException
from litestar.params import JSONBody
from litestar.status_codes import HTTP_200_OK

from chamber.common.bus import Bus
from chamber.common.bus.outbox import Outbox
from chamber.common.codec import Decoder
from chamber.common.contracts import (
    TERMINAL_STATES,
    JobCancelRequested,
    JobSubmitted,
    NodeInventory,
    QuotaConfig,
    TeamConfig,
)
from chamber.common.feasibility import priority_denial
from chamber.common.jobstore import JobStore
from chamber.common.kube.client import JOBS, JOBSETS, PYTORCHJOBS, RUNTIMES, TRAINJOBS, KubeClient, Obj
from chamber.common.kube.errors import KubeError, KubeNotFound
from chamber.common.kube.labels import MANAGED
from chamber.common.kube.watch import Reflector
from chamber.common.kube.workloads import (
    JOB_ID_PREFIX,
    TRAINJOB,
    Rejection,
    admission_patch,
    is_candidate,
    job_id_for,
    job_outcome,
    job_spec,
    kind_of,
    meta,
    runtime_ref,
    timestamp,
)
from chamber.common.log import get_logger
from chamber.common.quotastore import QuotaStore
from chamber.common.runtime import Context, wait_event
from chamber.gateway.intake import IntakeGate

log = get_logger(__name__)


RuntimeReader = Callable[[Obj], Awaitable[Obj | None]]
"""Reads the training runtime a TrainJob references; None when it does not exist."""


def runtime_reader(client: KubeClient) -> RuntimeReader:
    """A `RuntimeReader` on the API: a ClusterTrainingRuntime by name, a TrainingRuntime in the TrainJob's
    namespace (where the trainer looks for it too)."""

    async def read(trainjob: Obj) -> Obj | None:
        kind, name = runtime_ref(trainjob)
        res = RUNTIMES[kind]
        try:
            return await client.get(res, name, str(meta(trainjob).get("namespace") or "default"))
        except KubeNotFound:
            return None

    return read


class TeamNamespaces:
    """Which namespaces each team takes workloads from (`TeamConfig.namespaces`; a team without the list, or one
    not configured, takes them from any namespace), and which priority classes it may use
    (`TeamConfig.priorities`), as the quota configuration says now."""

    def __init__(self) -> None:
        self.teams: dict[str, TeamConfig] = {}

    def update(self, config: QuotaConfig) -> None:
        self.teams = {t.name: t for t in config.teams}

    def refusal(self, team: str, workload: Obj, priority: str) -> str:
        """Why `workload` (of this priority class) may not run as `team` (empty: it may)."""
        config = self.teams.get(team)
        denied = priority_denial(config, priority)
        if denied is not None:
            return denied
        namespace = str(meta(workload).get("namespace") or "default")
        allowed = sorted(set(config.namespaces)) if config is not None else []
        if not allowed or namespace in allowed:
            return ""
        return (f"team {team} takes workloads only from namespace{'s' * (len(allowed) > 1)} "
                f"{', '.join(allowed)}, not {namespace}")  # fmt: skip


class Admission:
    """The webhooks' decisions (pure apart from what they read: the largest node's GPU count, a TrainJob's
    training runtime through `runtimes`, and which namespaces each team takes workloads from)."""

    def __init__(self, runtimes: RuntimeReader | None = None, teams: TeamNamespaces | None = None) -> None:
        self.largest_node_gpus = 0
        self.runtimes = runtimes
        self.teams = teams or TeamNamespaces()

    async def review(self, review: Obj, *, mutating: bool) -> Obj:
        request = review.get("request") or {}
        obj = (request.get("object") or {}) if isinstance(request, dict) else None
        if not isinstance(request, dict) or not isinstance(obj, dict):
            raise ValidationException("not an AdmissionReview: `request` and `request.object` must be objects")
        uid = request.get("uid", "")
        response: Obj = {"uid": uid, "allowed": True}
        try:
            await self._review(request, obj, response, mutating=mutating)
        except (AttributeError, TypeError, ValueError, KeyError, IndexError) as exc:
            # An object of the wrong shape (the mutating webhook sees it before the API server validates it):
            # refused with what could not be read, not a 500.
            response = {
                "uid": uid,
                "allowed": False,
                "status": {
                    "code": 400,
                    "reason": "BadRequest",
                    "message": f"chamber: cannot read this object: {exc!r}"[:1000],
                },
            }
        return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}

    async def _review(self, request: Obj, obj: Obj, response: Obj, *, mutating: bool) -> None:
        if request.get("operation") == "CREATE" and is_candidate(obj):
            if mutating:
                patch = json.dumps(admission_patch(obj)).encode()
                response.update(patchType="JSONPatch", patch=base64.b64encode(patch).decode())
            else:
                try:
                    runtime = None
                    if kind_of(obj) == TRAINJOB and self.runtimes is not None:
                        runtime = await self.runtimes(obj)
                    spec = job_spec(obj, largest_node_gpus=self.largest_node_gpus, runtime=runtime)
                    refusal = self.teams.refusal(spec.team, obj, spec.priority)
                    if refusal:
                        raise Rejection(refusal)
                except KubeError as exc:  # the runtime could not be read: refuse now rather than guess
                    unreadable = f"chamber: cannot read the TrainJob's runtime: {exc}"
                    response.update(allowed=False, status={"code": 503, "reason": "ServiceUnavailable",
                                                           "message": unreadable})  # fmt: skip
                except Rejection as exc:
                    response.update(allowed=False, status={"code": 400, "reason": "BadRequest",
                                                           "message": f"chamber: {exc}"})  # fmt: skip


def webhook_app(admission: Admission) -> Litestar:
    @post("/mutate", status_code=HTTP_200_OK)
    async def mutate(data: JSONBody[dict[str, Any]]) -> dict[str, Any]:
        return await admission.review(data, mutating=True)

    @post("/validate", status_code=HTTP_200_OK)
    async def validate(data: JSONBody[dict[str, Any]]) -> dict[str, Any]:
        return await admission.review(data, mutating=False)

    @get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return Litestar([mutate, validate, healthz], openapi_config=None)


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


RETRY_S = 2.0
"""How often submits and cancels JetStream did not store are published again."""

UNREADABLE_MAX_S = 60.0
"""The longest wait before a TrainJob whose runtime could not be read is read again (2, 4, 8, ... s before)."""

RUNTIME_READS = 4
"""TrainJob runtime reads in flight at once (each may retry for seconds when the API errors)."""


class Intake:
    """Managed Jobs in, job events out."""

    def __init__(
        self,
        ctx: Context,
        bus: Bus,
        client: KubeClient,
        store: JobStore,
        *,
        teams: TeamNamespaces | None = None,
        gate: IntakeGate | None = None,
    ) -> None:
        self.ctx = ctx
        self.gate = gate if gate is not None else IntakeGate(0)
        """The gateway's intake backpressure (`intake`): a burst of Jobs is submitted no faster than the scheduler
        takes submits in, as a burst of API submits is."""
        self.teams = teams or TeamNamespaces()
        """Checked again here: a Job made while the webhooks were off, or before the list changed, is not taken."""
        self.bus = bus
        self.client = client
        self.store = store
        self.submitted: set[str] = set()
        self.waiting: dict[str, JobSubmitted] = {}
        """New Jobs' submits waiting for their turn at the gate, in the order their Jobs were seen (a TrainJob's once
        its runtime is read): a worker sends
        them (`_send_waiting`) while the watch goes on, so a burst of new Jobs does not hold up the events after
        it (a deleted Job's cancel waited up to a second per Job ahead of it)."""
        self._reading: dict[str, asyncio.Task[bool]] = {}
        """TrainJobs whose training runtime is being read, before their submit can queue (ended if deleted)."""
        self._seen_meanwhile: dict[str, Obj] = {}
        """The latest object of a TrainJob whose Job changed while its runtime was being read."""
        self._unreadable: dict[str, tuple[int, Obj, asyncio.TimerHandle | None]] = {}
        """TrainJobs whose runtime could not be read (the API erred): (reads failed, the object, the timer of the
        next read). Read again with a back-off (found by review: nothing read it again, and a suspended TrainJob
        that changes no more was never taken)."""
        self._reads = asyncio.Semaphore(RUNTIME_READS)
        self._turn: tuple[str, asyncio.Task[None]] | None = None
        """The job whose turn at the gate the worker awaits, and that wait: its Job deleted, the wait is ended."""
        self._sending: str | None = None
        """The job whose submit the worker is publishing now (its Job deleted meanwhile is cancelled after it)."""
        self._cancel_after: set[str] = set()
        self._arrived = asyncio.Event()
        self.unsent = Outbox(bus, "kube_intake")
        """Submits and cancels JetStream did not store (NATS away), published again every `RETRY_S` until stored:
        the Job may not change again for a watch event to bring it back."""
        self.reflectors: list[Reflector] = []
        self.kinds: set[str] = {"Job"}
        """The workload kinds watched (JobSet, PyTorchJob and TrainJob too where their CRDs are installed)."""
        self.runtimes = runtime_reader(client)

    async def on_job(self, kind: str, job: Obj) -> None:
        uid = str(meta(job).get("uid") or "")
        if not uid:
            return
        job_id = job_id_for(uid)
        if kind == "DELETED":
            self.submitted.discard(job_id)
            # A Job deleted while it waits is not submitted. It is cancelled all the same: one seen again after a
            # restart waits too, though an earlier gateway submitted it (the scheduler ignores a cancel of a job
            # it has no record of).
            self._unqueue(job_id)
            if job_id == self._sending:
                self._cancel_after.add(job_id)  # its submit is on its way: the cancel goes after it
                return
            await self._cancel(job_id)
            return
        if job_outcome(job) is not None:
            self.submitted.discard(job_id)  # finished: the scheduler has its outcome from the executor
            self._unqueue(job_id)
            return
        if job_id in self._reading:
            self._seen_meanwhile[job_id] = job  # looked at again if this read does not queue it
            return
        if job_id in self.submitted or job_id in self.waiting or job_id == self._sending:
            return
        if kind_of(job) == TRAINJOB:  # its runtime is read apart from the watch (with retries, it can take seconds)
            self._start_read(job_id, job)
            return
        await self._queue(job_id, job)

    def _start_read(self, job_id: str, job: Obj) -> None:
        task = asyncio.create_task(self._queue(job_id, job), name=f"kube-intake-runtime-{job_id}")
        self._reading[job_id] = task
        task.add_done_callback(functools.partial(self._read, job_id))

    def _read(self, job_id: str, task: "asyncio.Task[bool]") -> None:
        """A TrainJob's runtime read ended: its submit queued, or refused, or not (the API erred). Where its Job
        changed meanwhile and it is not queued, it is read again as it is now (that event came during the read)."""
        if self._reading.get(job_id) is not task:
            return  # ended with its Job (`_unqueue`)
        del self._reading[job_id]
        latest = self._seen_meanwhile.pop(job_id, None)
        if task.cancelled():
            return
        if (exc := task.exception()) is not None:
            log.error("kube_intake.trainjob_failed", job_id=job_id, exc_info=exc)
        elif latest is not None and not task.result():  # (queued, the worker may have taken it already)
            self._start_read(job_id, latest)
        elif task.result():
            self._unreadable.pop(job_id, None)
        elif (unreadable := self._unreadable.get(job_id)) is not None:
            failed, job, _ = unreadable
            delay = min(UNREADABLE_MAX_S, 2.0**failed)
            timer = asyncio.get_running_loop().call_later(delay, self._read_again, job_id)
            self._unreadable[job_id] = (failed, job, timer)

    def _read_again(self, job_id: str) -> None:
        """A TrainJob whose runtime could not be read, after its back-off: read again, unless its Job is gone or
        taken since."""
        unreadable = self._unreadable.get(job_id)
        if unreadable is None or job_id in self._reading or job_id in self.submitted or job_id in self.waiting:
            return
        self._start_read(job_id, unreadable[1])

    async def _queue(self, job_id: str, job: Obj) -> bool:
        """Queue a new Job's submit for its turn at the gate (a TrainJob's once its runtime is read); False when
        it was refused or its runtime could not be read."""
        try:
            runtime = None
            if kind_of(job) == TRAINJOB:
                async with self._reads:  # a relist of many TrainJobs reads a few runtimes at a time
                    runtime = await self._runtime(job)
            spec = job_spec(job, runtime=runtime)
            refusal = self.teams.refusal(spec.team, job, spec.priority)
            if refusal:
                raise Rejection(refusal)
        except KubeError as exc:
            log.warning("kube_intake.runtime_unreadable", job=meta(job).get("name"), error=str(exc))
            failed = self._unreadable.get(job_id, (0, job, None))[0] + 1
            self._unreadable[job_id] = (failed, job, None)  # read again after a back-off (`_read`)
            return False  # not marked submitted: the next event or relist tries again
        except Rejection as exc:
            log.warning("kube_intake.rejected", job=meta(job).get("name"), namespace=meta(job).get("namespace"),
                        reason=str(exc))  # fmt: skip
            return False
        submitted_at = timestamp(meta(job).get("creationTimestamp")) or self.ctx.clock.now()
        self.waiting[job_id] = JobSubmitted(job_id=job_id, spec=spec, submitted_at=submitted_at)
        self._arrived.set()
        return True

    @property
    def at_the_gate(self) -> str | None:
        """The job whose turn at the gate the worker awaits now (None: none)."""
        return self._turn[0] if self._turn is not None else None

    def _unqueue(self, job_id: str) -> None:
        """`job_id`'s Job is gone (or finished): its submit waits no more, also not for its runtime or its turn at
        the gate."""
        self._seen_meanwhile.pop(job_id, None)
        unreadable = self._unreadable.pop(job_id, None)
        if unreadable is not None and unreadable[2] is not None:
            unreadable[2].cancel()
        reading = self._reading.pop(job_id, None)
        if reading is not None:
            reading.cancel()
        self.waiting.pop(job_id, None)
        if self._turn is not None and self._turn[0] == job_id:
            self._turn[1].cancel()

    async def _send_waiting(self, stop: asyncio.Event) -> None:
        """Submit the waiting Jobs in the order they were seen, each once the gate lets it through."""
        while not stop.is_set():
            if not self.waiting:
                self._arrived.clear()
                await wait_event(self._arrived, 0.5)  # (and the stop is looked at twice a second)
                continue
            job_id, submit = next(iter(self.waiting.items()))
            turn = asyncio.ensure_future(self.gate.admit(job_id))
            self._turn = (job_id, turn)
            try:
                await asyncio.wait([turn])
            except BaseException:  # the worker stopped: a turn that came meanwhile is given back
                if turn.done() and not turn.cancelled() and turn.exception() is None:
                    self.gate.taken(job_id)
                turn.cancel()
                raise
            finally:
                self._turn = None
            if turn.cancelled():
                continue  # its Job was deleted (or finished) while it waited: the turn goes to the next
            turn.result()
            if self.waiting.get(job_id) is not submit:
                self.gate.taken(job_id)  # its Job was deleted (or finished) while it waited
                continue
            del self.waiting[job_id]
            self._sending = job_id
            try:
                await self._publish(self.bus.names.job_submit(job_id), submit, job_id)
            except Exception:  # not marked submitted: the next event or relist of its Job tries again
                log.exception("kube_intake.submit_failed", job_id=job_id, job=submit.spec.name)
                self.gate.taken(job_id)
                self._cancel_after.discard(job_id)
                continue
            except BaseException:
                self.gate.taken(job_id)
                raise
            finally:
                self._sending = None
            if job_id in self._cancel_after:
                self._cancel_after.discard(job_id)
                await self._cancel(job_id)
                continue
            self.submitted.add(job_id)
            spec = submit.spec
            log.info("kube_intake.submitted", job_id=job_id, job=spec.name, team=spec.team, gpus=spec.gpus)

    async def _cancel(self, job_id: str) -> None:
        await self._publish(self.bus.names.job_cancel(job_id),
                            JobCancelRequested(job_id=job_id, requested_at=self.ctx.clock.now()),
                            f"{job_id}:cancel")  # fmt: skip

    async def _runtime(self, trainjob: Obj) -> Obj | None:
        """The TrainJob's training runtime, retried a few times when the API does not answer."""
        for attempt in range(3):
            try:
                return await self.runtimes(trainjob)
            except KubeNotFound:
                return None
            except KubeError:
                if attempt == 2:
                    raise
                await asyncio.sleep(0.5 * 2**attempt)
        return None

    async def on_synced(self, jobs: dict[str, Obj]) -> None:
        """After a (re)list of every watched namespace: cancel active Chamber jobs whose Job is gone."""
        if not all(r.synced.is_set() for r in self.reflectors):
            return
        present = {job_id_for(uid) for r in self.reflectors for uid in r.objects}
        namespaces = self._namespaces()
        for job_id, (record, _) in (await self.store.load_all()).items():
            ref = record.spec.workload
            if (
                job_id.startswith(JOB_ID_PREFIX) and record.state not in TERMINAL_STATES and job_id not in present
                and ref is not None and ref.kind in self.kinds and not record.cancel_requested
                and (namespaces is None or ref.namespace in namespaces)
            ):  # fmt: skip
                log.info("kube_intake.job_gone", job_id=job_id, job=ref.name, namespace=ref.namespace)
                await self._cancel(job_id)

    def _namespaces(self) -> set[str] | None:
        raw = self.ctx.settings.kube_namespaces
        return {n.strip() for n in raw.split(",") if n.strip()} or None

    async def _publish(self, subject: str, event: Any, msg_id: str) -> None:
        await self.unsent.publish(subject, event, msg_id, retry_delays=(0.2, 0.4, 0.8, 1.6, 3.2))

    async def _send_unsent(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=RETRY_S)
            await self.unsent.flush()

    async def run(self, stop: asyncio.Event) -> None:
        namespaces: list[str | None] = [*sorted(self._namespaces() or ())] or [None]
        resources = [JOBS]
        for crd in (JOBSETS, PYTORCHJOBS, TRAINJOBS):
            if await self.client.serves(crd):
                resources.append(crd)
                self.kinds.add(crd.kind)
        self.reflectors = [
            Reflector(self.client, res, self.on_job, namespace=ns, labels=f"{MANAGED}=true",
                      on_synced=self.on_synced, name=f"{res.plural}/{ns or '*'}")
            for res in resources for ns in namespaces
        ]  # fmt: skip
        try:
            await asyncio.gather(self._send_unsent(stop), self._send_waiting(stop),
                                 *(r.run(stop) for r in self.reflectors))  # fmt: skip
        finally:
            for reading in list(self._reading.values()):
                reading.cancel()


def _ssl(cert_dir: str) -> dict[str, str]:
    if not cert_dir:
        return {}
    return {"ssl_certfile": os.path.join(cert_dir, "tls.crt"), "ssl_keyfile": os.path.join(cert_dir, "tls.key")}


CERT_RELOAD_S = 30.0
"""How often the webhooks' certificate files are checked for a renewal."""


def _fingerprint(cert_dir: str) -> bytes:
    digest = hashlib.sha256()
    for name in ("tls.crt", "tls.key"):
        with contextlib.suppress(OSError), open(os.path.join(cert_dir, name), "rb") as f:
            digest.update(f.read())
    return digest.digest()


async def reload_certificate(config: uvicorn.Config, cert_dir: str, stop: asyncio.Event,
                             every_s: float = CERT_RELOAD_S) -> None:  # fmt: skip
    """Serve a renewed certificate without a restart. cert-manager (and the chart's hook, at an upgrade) renews it
    in the mounted Secret, whose files the kubelet swaps; the API server, handed the new CA, would refuse the old
    certificate, and with failurePolicy Fail every labelled Job with it, until the gateway happened to restart.
    New handshakes use the new certificate (the server's SSL context loads it in place)."""
    seen = _fingerprint(cert_dir)
    certfile, keyfile = os.path.join(cert_dir, "tls.crt"), os.path.join(cert_dir, "tls.key")
    while not await wait_event(stop, every_s):
        now = _fingerprint(cert_dir)
        context: ssl.SSLContext | None = getattr(config, "ssl", None)
        if now == seen or context is None:
            continue
        try:
            context.load_cert_chain(certfile, keyfile)
        except (OSError, ssl.SSLError) as exc:  # caught mid-swap, or a bad pair: the old one stays, try again
            log.warning("kube_intake.certificate_reload_failed", error=str(exc))
            continue
        seen = now
        log.info("kube_intake.certificate_reloaded", cert_dir=cert_dir)


async def run(ctx: Context, stop: asyncio.Event, gate: IntakeGate | None = None) -> None:
    """The webhooks and the watcher, until `stop`; submits pass the gateway's intake `gate`."""
    s = ctx.settings
    bus = await ctx.bus()
    client = KubeClient.connect(s.kube_api)
    teams = TeamNamespaces()
    quota = await QuotaStore.open(bus)
    teams.update((await quota.get())[0])  # before the webhooks answer: no window in which any namespace passes
    stop_following = await quota.follow(teams.update)
    admission = Admission(runtime_reader(client), teams)

    def on_inventory(inv: NodeInventory) -> None:
        admission.largest_node_gpus = max(admission.largest_node_gpus, len(inv.node.gpus))

    await bus.watch_latest(bus.names.subject("inventory.>"), Decoder(NodeInventory), on_inventory)
    config = uvicorn.Config(webhook_app(admission), host=s.kube_webhook_host, port=s.kube_webhook_port,
                            log_config=None, access_log=False, **_ssl(s.kube_webhook_cert_dir))  # type: ignore[arg-type]  # fmt: skip
    server = _Server(config)
    serving = asyncio.create_task(server.serve())
    reloading = (
        asyncio.create_task(reload_certificate(config, s.kube_webhook_cert_dir, stop))
        if s.kube_webhook_cert_dir else None
    )  # fmt: skip
    intake = Intake(ctx, bus, client, await JobStore.open(bus), teams=teams, gate=gate)
    watching = asyncio.create_task(intake.run(stop))
    log.info("kube_intake.started", api=client.host, webhooks=f"{s.kube_webhook_host}:{s.kube_webhook_port}")
    try:
        await stop.wait()
    finally:
        server.should_exit = True
        await asyncio.gather(serving, watching, *([reloading] if reloading else []), return_exceptions=True)
        await stop_following()
        await client.close()
        await bus.close()
