"""Job operations, shared by the HTTP routes and the gRPC service: submit (idempotent on request), read, list,
cancel, and the timeline. Each checks the caller's team scope and refuses what can never work, before anything
is written.

A submit is an event on the durable JOBS stream, acknowledged by JetStream before the caller gets its answer, so
an accepted job is never lost. With an idempotency key, the key is bound to the job id first (KV create, atomic);
a retry finds the binding and answers with the same job, re-publishing it under its own id if the first attempt
died between the two writes (JetStream drops the duplicate if it did not).
"""

import hashlib
import re
import secrets

import msgspec
import nats.errors
import nats.js.errors

from chamber.common.bus import PublishError
from chamber.common.codec import Decoder, encode
from chamber.common.contracts import (
    MAX_SPEC_BYTES,
    TERMINAL_STATES,
    JobCancelRequested,
    JobEvent,
    JobPlaced,
    JobRecord,
    JobSpec,
    JobState,
    JobSubmitted,
)
from chamber.common.subjects import DECISIONS, JOBS
from chamber.common.workload import workload_problem
from chamber.gateway.core.authz import Principal, team_denial
from chamber.gateway.core.requests import SubmitJobRequest
from chamber.gateway.core.timeline import TimelineEntry, record_changes, timeline
from chamber.gateway.core.views import JobView, job_view, submitted_view
from chamber.gateway.errors import (
    BadRequest,
    Conflict,
    FieldProblem,
    Forbidden,
    NotFound,
    PayloadTooLarge,
    Unavailable,
    Unprocessable,
)
from chamber.gateway.state import GatewayState

JOB_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
IDEMPOTENCY_KEY = re.compile(r"[\x21-\x7e]{1,255}")
"""Both checked with `fullmatch`: `^...$` with `match` accepts a trailing newline."""


class JobTimeline(msgspec.Struct, kw_only=True):
    job: JobView
    events: list[TimelineEntry]


class _Binding(msgspec.Struct, kw_only=True):
    job_id: str
    fingerprint: str
    submitted_at: float
    spec: JobSpec


_binding = msgspec.json.Decoder(_Binding)
_canonical = msgspec.json.Encoder(order="deterministic")
"""A request's fingerprint for its idempotency key: the same job whatever order its `env` keys came in (a gRPC
client's map fields may come in any order). Mappings are sorted, fields keep their order: a spec whose keys came
sorted has the fingerprint it had before, so a retry across an upgrade still finds its job."""


def request_fingerprint(spec: JobSpec) -> str:
    """What an idempotency key is bound to: the spec, whatever order its mappings came in (`_canonical`).

    Every field is in it, those at their default too, as the spec was encoded before it left them out
    (`omit_defaults`): a key bound by an older gateway (keys last a day) still finds its job."""
    fields = (
        _canonical.encode(name) + b":" + _canonical.encode(getattr(spec, name)) for name in spec.__struct_fields__
    )
    return hashlib.sha256(b"{" + b",".join(fields) + b"}").hexdigest()


def new_job_id(now: float) -> str:
    """Time-ordered and unique: milliseconds since the epoch in hex, then 32 random bits."""
    return f"j{int(now * 1000):011x}{secrets.token_hex(4)}"


def check_job_id(job_id: str) -> None:
    if not JOB_ID.fullmatch(job_id):
        raise NotFound(f"no job {job_id!r} (job ids are 1-128 letters, digits, '-' or '_')", code="no-such-job")


def admit(gw: GatewayState, who: Principal, body: SubmitJobRequest) -> JobSpec:
    """The spec to publish, or the reason the request is refused whatever the fleet (403 another team's, 413 too
    large to carry, 400 a workload it may not name); whether this Chamber can ever run it is `check_fits`."""
    spec = body.to_spec()
    size = len(encode(spec))
    if size > MAX_SPEC_BYTES:
        raise PayloadTooLarge(
            f"the job's spec is {size} bytes encoded, over the {MAX_SPEC_BYTES} a job may have (a large command "
            "line or environment belongs in a file the job reads)",
            code="job-too-large",
        )
    why = team_denial(who, spec.team)
    if why is not None:
        raise Forbidden(why, code="not-your-team")
    if spec.workload is not None:
        raise BadRequest(
            "workload: set by Chamber's Kubernetes intake for the Job it stands for, not by API clients",
            code="workload-not-allowed",
        )
    return spec


def check_fits(gw: GatewayState, spec: JobSpec) -> None:
    """400 when this Chamber's executor cannot run such a job (`workload_problem`), 422 when it can never run on
    this fleet under these quotas. Asked only of a new request: a retry of one already accepted gets its job,
    whatever changed since (the executor too)."""
    workload = workload_problem(spec, gw.ctx.settings.executor)
    if workload is not None:
        raise BadRequest(workload, code="bad-workload")
    problems = gw.never_fits(spec)
    if problems:
        raise Unprocessable(
            "this job can never run: " + "; ".join(p.message for p in problems),
            code=problems[0].code,
            errors=[FieldProblem(field=f"$.{p.field}", message=p.message) for p in problems],
        )


async def _bound(gw: GatewayState, key: str) -> _Binding | None:
    """The job an idempotency key was used for, if it was."""
    try:
        entry = await gw.idempotency.get(key)
    except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
        return None
    return _binding.decode(entry.value) if entry.value else None


async def _publish_submit(gw: GatewayState, job_id: str, spec: JobSpec, now: float) -> None:
    gw.require_bus()
    await gw.intake.admit(job_id)
    try:
        await gw.bus.publish(gw.bus.names.job_submit(job_id), JobSubmitted(job_id=job_id, spec=spec, submitted_at=now),
                             msg_id=job_id)  # fmt: skip
    except PublishError as exc:
        gw.intake.taken(job_id)
        raise Unavailable(f"the job was not stored (JetStream did not acknowledge): {exc}") from exc
    except BaseException:  # cancelled (client gone, gRPC deadline, shutdown) or any other failure: not stored
        gw.intake.taken(job_id)
        raise


async def submit(
    gw: GatewayState, who: Principal, body: SubmitJobRequest, idempotency_key: str | None = None
) -> tuple[JobView, bool]:
    """Accept a job; returns its view and whether this was a replay of an earlier submit with the same key."""
    spec = admit(gw, who, body)
    gw.require_bus()
    now = gw.clock.now()
    if idempotency_key is None:
        check_fits(gw, spec)
        job_id = new_job_id(now)
        await _publish_submit(gw, job_id, spec, now)
        return submitted_view(job_id, spec, now), False
    if not IDEMPOTENCY_KEY.fullmatch(idempotency_key):
        raise BadRequest("Idempotency-Key must be 1-255 visible ASCII characters", code="bad-idempotency-key",
                         errors=[FieldProblem(field="Idempotency-Key", message="1-255 visible ASCII")])  # fmt: skip
    key = hashlib.sha256(f"{who.id}\n{idempotency_key}".encode()).hexdigest()
    fingerprint = request_fingerprint(spec)
    binding = _Binding(job_id=new_job_id(now), fingerprint=fingerprint, submitted_at=now, spec=spec)
    try:
        known = await _bound(gw, key)
        if known is None:
            check_fits(gw, spec)
            try:
                await gw.idempotency.create(key, msgspec.json.encode(binding))
            except nats.js.errors.KeyWrongLastSequenceError:  # the same request, at the same moment
                known = await _bound(gw, key)
                if known is None:
                    raise Unavailable("the idempotency key changed while it was checked; retry") from None
        fresh = known is None
        binding = known or binding
    except (nats.errors.Error, msgspec.DecodeError) as exc:
        raise Unavailable(f"cannot check the idempotency key: {exc}") from exc
    if binding.fingerprint != fingerprint:
        raise Conflict(f"Idempotency-Key {idempotency_key!r} was used for a different request (job "
                       f"{binding.job_id}); use a new key", code="idempotency-key-reused")  # fmt: skip
    if not fresh:
        view = await gw.job(binding.job_id)
        if view is not None:
            return view, True
    await _publish_submit(gw, binding.job_id, binding.spec, binding.submitted_at)
    return submitted_view(binding.job_id, binding.spec, binding.submitted_at), not fresh


async def get(gw: GatewayState, who: Principal, job_id: str) -> JobView:
    check_job_id(job_id)
    view = await gw.job(job_id)
    if view is None:
        raise NotFound(f"no job {job_id!r}", code="no-such-job")
    why = team_denial(who, view.team)
    if why is not None:
        raise Forbidden(why, code="not-your-team")
    return view


def select(
    gw: GatewayState, who: Principal, *, state: JobState | None, team: str | None, limit: int
) -> list[JobRecord]:
    if team is not None:
        why = team_denial(who, team)
        if why is not None:
            raise Forbidden(why, code="not-your-team")
    return gw.jobs.select(limit=limit, state=state, team=team, teams=who.team_scope)


async def cancel(gw: GatewayState, who: Principal, job_id: str) -> JobView:
    view = await get(gw, who, job_id)
    if view.state in TERMINAL_STATES:
        raise Conflict(f"job {job_id} already {view.state.value}", code="already-finished")
    gw.require_bus()
    try:
        await gw.bus.publish(gw.bus.names.job_cancel(job_id),
                             JobCancelRequested(job_id=job_id, requested_at=gw.clock.now()),
                             msg_id=f"{job_id}:cancel")  # fmt: skip
    except PublishError as exc:
        raise Unavailable(f"the cancel was not stored: {exc}") from exc
    return msgspec.structs.replace(view, cancel_requested=True)


_job_events = Decoder(JobEvent)
_placed = Decoder(JobPlaced)


async def events(gw: GatewayState, who: Principal, job_id: str) -> JobTimeline:
    view = await get(gw, who, job_id)
    since = view.submitted_at - 1.0
    names = gw.bus.names
    intents = [e for e in await gw.read_stream(JOBS, names.subject(f"jobs.*.{job_id}"), since, _job_events)
               if isinstance(e, JobSubmitted | JobCancelRequested)]  # fmt: skip
    placed = await gw.read_stream(DECISIONS, names.decision_placed(job_id), since, _placed)
    changes = record_changes(await gw.job_history(job_id))
    stored = await gw.job_record(job_id)  # read after the history: anything newer is not in it yet
    return JobTimeline(job=view if stored is None else job_view(stored),
                       events=timeline(intents, [*placed, *changes], stored))  # fmt: skip


def views(records: list[JobRecord]) -> list[JobView]:
    return [job_view(r) for r in records]
