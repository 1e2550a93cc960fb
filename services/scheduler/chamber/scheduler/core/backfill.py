"""EASY backfill: reserve for the blocked queue head the GPUs it will get, and when.

The head's earliest start is found by releasing running jobs in order of their estimated end (the smaller of the
user's `max_runtime_s` and the runtime predicted from history, see `estimates`; jobs that are stopping end now;
jobs without an estimate end at an unknown time, last; a job past its estimate is expected to run as long again
as it has) until the head fits. The GPUs of that placement that are free now are held back for it: later jobs
may use them only if their own estimate says they finish before the reserved start. A job without an estimate,
or any job when the start is unknown, backfills only onto capacity the reservation does not need.

With several reservations in a cycle, each later one plans only with GPUs no earlier one counts on (`taken`):
two blocked gangs never wait for the same node to drain.
"""

from collections.abc import Iterable, Sequence, Set
from dataclasses import dataclass
from operator import itemgetter

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


Release = tuple[bool, float, int, RunningJob]
"""(end unknown, expected end, tie-break, job): the order running jobs are expected to free their GPUs in."""


_END = itemgetter(1)


def release_order(running: Iterable[RunningJob], now: float) -> list[Release]:
    """Running jobs by expected end: stopping ones now, then by estimate, unknown last (by start). Computed once per
    cycle and shared by its reservations, which read it from the front. Sorted by the end alone (a float: the sort
    compares two such without a call), the tie-break kept by the sort's stability: ~10,000 running jobs were a
    heap ordered by whole tuples, each comparison a few calls, and each reservation popped its own copy of it (a
    heap's pops, the heap and the copies were a tenth of a cycle with a thousand teams)."""
    known: list[Release] = []
    unknown: list[Release] = []
    for i, r in enumerate(running):
        if r.stopping:
            known.append((False, now, i, r))
        elif r.est_end is not None and r.est_end > now:
            known.append((False, r.est_end, i, r))
        elif r.est_end is not None:
            # Overdue: its estimate was wrong. It has run this long; expect as long again (heavy-tailed runtimes:
            # the longer a job has run, the longer it is likely to go on), not "any moment now" forever.
            known.append((False, now + (now - r.started_at), i, r))
        else:
            unknown.append((True, r.started_at, i, r))
    known.sort(key=_END)
    unknown.sort(key=_END)
    known.extend(unknown)
    return known


def reserve(
    index: FleetIndex, job: PendingJob, order: Sequence[Release], now: float, taken: Set[str] = frozenset()
) -> Reservation | None:
    """`order`: see `release_order`. `taken`: slots earlier reservations count on (free or not), left out of this
    one's plan."""
    parts = index.partitions_for(job.shape)
    everywhere = len(parts) == index.partition_count()
    eligible = None if everywhere else index.nodes_in(parts)
    avail = {node.name: len(node.free) for node in index.nodes_with(parts, 1)}
    for name, n in per_node(job.nominated, eligible).items():
        avail[name] = avail.get(name, 0) + n
    counter = CapacityCounter(index, job.shape, avail)
    trial = WhatIf(index, job.nominated)
    if counter.fits():
        gpus = trial.allocate(job.shape)
        return None if gpus is None else Reservation(job.id, now, gpus)
    taken_nodes = {slot.rpartition("/")[0] for slot in taken}
    for unknown, at, _, r in order:
        spread: Iterable[tuple[str, int]] = r.spread
        gpus = r.gpus
        if eligible is not None or any(node in taken_nodes for node, _ in spread):
            gpus = tuple(g for g in gpus if (eligible is None or g.node in eligible) and g.slot not in taken)
            if not gpus:
                continue
            spread = per_node(gpus).items()
        for name, n in spread:
            counter.add(name, n)
        trial.evict(gpus)
        if counter.fits():
            placed = trial.allocate(job.shape)
            if placed is None:
                return None
            return Reservation(job.id, None if unknown else max(now, at), placed)
    return None
