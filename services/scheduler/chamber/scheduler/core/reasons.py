"""Why a job waits, as data: a kind, the stable words, and the live numbers kept apart.

A waiting job's reason is re-decided every cycle, but only its kind and its stable words are worth storing: the
numbers in it (GPUs free now, the reserved start) and the jobs capacity is reserved for change all the time, and
writing every waiting record each cycle to refresh them would cost more than the scheduling itself. The service
stores `text` when `(kind, text)` changes; `render()` adds the live part for whoever shows the reason now (the
simulator's log, a test). (Naming the reserved-for jobs in the stored words rewrote every blocked gang's record
each time the reservation passed to another job: 190 versions of one record in a `make chaos` run.)
"""

from dataclasses import dataclass
from enum import StrEnum


class WaitKind(StrEnum):
    QUEUED = "queued"
    """Behind earlier jobs of its sub-queue (same priority, standing, team and shape)."""
    CAPACITY = "capacity"
    """No room for its shape now, and nothing it may preempt."""
    RESERVED = "reserved"
    """The head that must not starve: capacity is reserved for it (EASY backfill)."""
    QUOTA = "quota"
    """Its team's quota (or the cohort's lendable capacity) does not admit it."""
    BUDGET = "budget"
    """Its team has spent its budget for the period."""
    PREEMPTING = "preempting"
    """Jobs were preempted for it; it starts when they have stopped."""
    UNSCHEDULABLE = "unschedulable"
    """No node in the fleet could ever hold it as it is (missing pool, model, or too few GPUs in all)."""


@dataclass(frozen=True, slots=True)
class Reason:
    kind: WaitKind
    text: str
    """The stable words: what the job needs and why it waits, without numbers that change between cycles."""
    free: int | None = None
    """GPUs free now in the partitions the job may use (live)."""
    start_in_s: float | None = None
    """For a reservation: the earliest start from running jobs' estimates, seconds from the decision (live)."""
    reserved_for: tuple[str, ...] = ()
    """The first jobs capacity is reserved for, which keep this one waiting (live; at most three)."""
    reserved_more: int = 0
    """How many more it is reserved for (live)."""

    def __init__(
        self,
        kind: WaitKind,
        text: str,
        free: int | None = None,
        start_in_s: float | None = None,
        *,
        reserved_for: tuple[str, ...] = (),
        reserved_more: int = 0,
    ) -> None:
        object.__setattr__(self, "kind", kind)  # (its own `__init__`: see `decisions`)
        object.__setattr__(self, "text", text)
        object.__setattr__(self, "free", free)
        object.__setattr__(self, "start_in_s", start_in_s)
        object.__setattr__(self, "reserved_for", reserved_for)
        object.__setattr__(self, "reserved_more", reserved_more)

    def render(self) -> str:
        text = self.text
        if self.reserved_for:
            more = f" and {self.reserved_more} more" if self.reserved_more else ""
            text += f" ({', '.join(self.reserved_for)}{more})"
        if self.free is not None:
            text += f"; {self.free} free"
        if self.kind == WaitKind.RESERVED:
            if self.start_in_s is None:
                text += " (earliest start unknown: running jobs have no runtime estimate)"
            else:
                text += f", earliest start in {duration(self.start_in_s)}"
        return text

    def __str__(self) -> str:
        return self.render()


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{max(0, round(seconds))} s"
    if seconds < 90 * 60:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"


def placed_on(nodes: list[str]) -> str:
    """`placed on a, b, c, d and 3 more` (nodes sorted by the caller)."""
    shown = ", ".join(nodes[:4]) + (f" and {len(nodes) - 4} more" if len(nodes) > 4 else "")
    return f"placed on {shown}"
