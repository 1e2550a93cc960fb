"""What a scheduling cycle decides. Every decision says why: placements in words, waits as data (`Reason`).

The classes a cycle makes thousands of have their own `__init__` (see `chamber.scheduler.core`: compiled, the one
`dataclass` writes runs as interpreted Python, ten times slower than the class's own)."""

from dataclasses import dataclass

from chamber.common.contracts import GpuRef
from chamber.scheduler.core.reasons import Reason


@dataclass(frozen=True, slots=True)
class Place:
    job_id: str
    attempt: int
    gpus: tuple[GpuRef, ...]
    reason: str

    def __init__(self, job_id: str, attempt: int, gpus: tuple[GpuRef, ...], reason: str) -> None:
        object.__setattr__(self, "job_id", job_id)
        object.__setattr__(self, "attempt", attempt)
        object.__setattr__(self, "gpus", gpus)
        object.__setattr__(self, "reason", reason)


@dataclass(frozen=True, slots=True)
class Preempt:
    """Stop a running job: give it `grace_s` to checkpoint, then it returns to the queue."""

    job_id: str
    attempt: int
    grace_s: float
    reason: str
    by: str | None = None
    """The job it makes room for; None for an interruption (its GPU became unschedulable)."""
    interrupt: bool = False
    move_to: tuple[GpuRef, ...] = ()
    """Consolidation: the job starts again at once on these GPUs, held for it (`SchedulingState.moves`); it is
    moved to open room for `by`, not displaced by it."""

    @property
    def move(self) -> bool:
        return bool(self.move_to)


@dataclass(frozen=True, slots=True)
class Nominate:
    """Set GPUs aside for a preemptor until its victims have stopped."""

    job_id: str
    gpus: tuple[GpuRef, ...]
    reason: str
    victims: tuple[str, ...] = ()
    """The attempts it waits for (their GPUs, or the team quota they hold), as `job/attempt`: the record keeps them
    (`JobRecord.waiting_for`), so a scheduler restarted in between still waits for them (with bare job ids, as
    written before 2026-12-05, it waited only for the holders of its GPUs)."""


@dataclass(frozen=True, slots=True)
class Wait:
    job_id: str
    why: Reason

    def __init__(self, job_id: str, why: Reason) -> None:
        object.__setattr__(self, "job_id", job_id)
        object.__setattr__(self, "why", why)

    @property
    def reason(self) -> str:
        """The reason in words, with its live numbers."""
        return self.why.render()


Decision = Place | Preempt | Nominate | Wait
