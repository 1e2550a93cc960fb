"""Building the scheduler's state from scratch: at start-up, after the ledger was lost, and in tests.

Inputs are what the service can read: the nodes (inventory), the ledger's owners and cordons, the active job
records and the quota inputs. Slots held in the ledger by nobody the records know stay out of the free index
until the ledger is reconciled, so a stale claim can never be double-booked.
"""

from collections.abc import Iterable, Mapping

from chamber.common.contracts import Cordon, GpuRef, JobRecord, Node
from chamber.common.quota import QuotaBook
from chamber.scheduler.core.estimates import RuntimePredictor
from chamber.scheduler.core.lifecycle import holds_gpus, needs_placement
from chamber.scheduler.core.model import PendingJob, pending_from, running_from
from chamber.scheduler.core.state import SchedulerConfig, SchedulingState


def build_state(
    nodes: Iterable[Node],
    owners: Mapping[str, str],
    cordoned: Mapping[str, Cordon],
    records: Iterable[JobRecord],
    *,
    standing: Mapping[str, float] | None = None,
    borrowed: frozenset[str] | None = None,
    quota: QuotaBook | None = None,
    budget_blocks: Mapping[str, str] | None = None,
    config: SchedulerConfig | None = None,
    predictor: RuntimePredictor | None = None,
) -> SchedulingState:
    """`borrowed`: jobs on borrowed capacity; computed from `quota` when not given. `predictor`: the runtime
    history learned so far (from the finished records)."""
    state = SchedulingState(config)
    if predictor is not None:
        state.predictor = predictor
    state.cordoned = dict(cordoned)
    classes = dict(state.config.classes)
    nodes = sorted(nodes, key=lambda n: n.name)
    pool_of = {n.name: n.pool for n in nodes}
    pending: list[PendingJob] = []
    moving: list[tuple[str, tuple[GpuRef, ...], PendingJob | None]] = []
    """Jobs being moved (consolidation), with the GPUs held for them: still stopping (no job to requeue), or
    stopped and not yet placed again."""
    for record in records:
        if holds_gpus(record):
            assert record.placement is not None
            pool = pool_of.get(record.placement.gpus[0].node, "")
            run = running_from(record, classes, pool=pool)
            if state.config.predict and state.config.backfill_on_predictions:
                spec = record.spec
                total = state.predictor.predict(spec.team, spec.name, spec.gpus_per_replica * spec.replicas)
                if total is not None:
                    end = run.started_at + max(0.0, total - record.run_s)
                    run.est_end = end if run.est_end is None else min(run.est_end, end)
            state.running[record.id] = run
            state.track(run)
            state.count_preemptible(run, +1)
            for ref in run.gpus:  # two records on one GPU: the one the ledger backs holds it
                owner = owners.get(ref.slot)
                state.contest(ref.slot, record.id, holds=owner is not None and owner.rsplit("/", 1)[0] == record.id)
            if record.stopping and record.move_to:
                moving.append((record.id, tuple(record.move_to), None))
        elif needs_placement(record):
            job = pending_from(record, classes)
            if record.move_to and not job.nominated:
                moving.append((record.id, tuple(record.move_to), job))
            elif job.nominated:
                state.nominated[job.id] = job
                for ref in job.nominated:
                    state.nominated_slots[ref.slot] = job.id
            else:
                pending.append(job)
    held = set(owners) | state.held_slots()
    for node in nodes:
        indices = [g.index for g in node.gpus]
        free = [i for i in indices if f"{node.name}/{i}" not in held]
        model = node.gpus[0].model if node.gpus else ""
        topo = node.topology
        state.index.add_node(
            node.name, pool=node.pool, model=model, rack=topo.rack, zone=topo.zone, capacity=len(indices), free=free
        )
    state.set_quota(quota, standing, budget_blocks)
    if borrowed is not None:
        for run in state.running.values():
            run.borrowed = run.id in borrowed
    for job_id, gpus, stopped in moving:  # once every holder and nomination is known: only free GPUs are held
        if state.restore_move(job_id, gpus):
            if stopped is not None:
                state.requeue(stopped)  # straight to the GPUs held for it, as when it stopped
        elif stopped is not None:
            pending.append(stopped)
    for job in pending:
        state.add(job)
    state.arrivals.clear()
    return state
