"""Priority classes: a name users submit, a value the queue orders by, and whether it may be preempted.

Defaults follow KAI-Scheduler's convention: classes at or above the threshold are never preempted.
"""

from dataclasses import dataclass

NON_PREEMPTIBLE_THRESHOLD = 100


@dataclass(frozen=True, slots=True)
class PriorityClass:
    name: str
    value: int

    @property
    def preemptible(self) -> bool:
        return self.value < NON_PREEMPTIBLE_THRESHOLD


DEFAULT_CLASSES: dict[str, PriorityClass] = {
    pc.name: pc
    for pc in (
        PriorityClass("inference", 125),
        PriorityClass("train", 100),
        PriorityClass("research", 50),
        PriorityClass("best-effort", 0),
    )
}


def priority_value(name: str, classes: dict[str, PriorityClass] = DEFAULT_CLASSES) -> int:
    """The value of a class name; an unknown name ranks lowest (the gateway rejects unknown names up front)."""
    pc = classes.get(name)
    return pc.value if pc is not None else -1
