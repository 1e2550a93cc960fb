"""EASY backfill: reserve for the blocked queue head the GPUs it will get, and when.

The head's earliest start is found by releasing running jobs in order of their estimated end (the user's
`max_runtime_s`; jobs that are stopping end now; jobs without an estimate end at an unknown time, last) until
the head fits. The GPUs of that placement that are free now are held back for it: later jobs may use them only
if their own estimate says they finish before the reserved start. A job without an estimate, or any job when the
start is unknown, backfills only onto capacity the reservation does not need.
"""

from dataclasses import dataclass

from chamber.common.contracts import GpuRef
from chamber.scheduler.core.capacity import CapacityCounter
from chamber.scheduler.core.fleet import FleetIndex
from chamber.scheduler.core.model import PendingJob, RunningJob
from chamber.scheduler.core.whatif import WhatIf, per_node


@dataclass(frozen=True, slots=True)
class Reservation:
    job_id: str
    start: float | None
    """Earliest start from running jobs' estimates; None when it depends on jobs without one."""
    gpus: tuple[GpuRef, ...]


def reserve(index: FleetIndex, job: PendingJob, running: list[RunningJob], now: float) -> Reservation | None:
    parts = set(index.partitions_for(job.shape))
    eligible = {name for name, node in index.nodes.items() if node.partition in parts}
    avail = {name: len(index.nodes[name].free) for name in eligible}
    counter = CapacityCounter(index, job.shape, avail)
    releasing = [r for r in running if any(g.node in eligible for g in r.gpus)]

    def ends(r: RunningJob) -> tuple[bool, float, str]:
        if r.stopping:
            return (False, now, r.id)
        return (r.est_end is None, r.est_end if r.est_end is not None else r.started_at, r.id)

    releasing.sort(key=ends)
    trial = WhatIf(index, job.nominated)
    start: float | None = now
    for r in releasing:
        if counter.fits():
            break
        for name, n in per_node(r.gpus, eligible).items():
            counter.add(name, n)
        trial.evict(r.gpus)
        unknown, at, _ = ends(r)
        start = None if unknown else max(now, at)
    if not counter.fits():
        return None
    gpus = trial.allocate(job.shape)
    if gpus is None:
        return None
    return Reservation(job.id, start, gpus)
