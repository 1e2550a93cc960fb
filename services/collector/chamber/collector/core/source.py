"""The one interface every telemetry source implements: the simulated fleet now, NVML on each node next.

A source reports what it sees; it never publishes. The collector shell turns its output into bus messages:
one `NodeInventory` per node (periodically and on change), one `NodeTelemetry` batch per node per interval.
"""

from collections.abc import Mapping
from typing import Protocol

from chamber.common.contracts import NodeInventory, NodeTelemetry


class TelemetrySource(Protocol):
    def inventory(self, now: float) -> list[NodeInventory]:
        """The nodes this source covers (a node agent: its own node; the simulator: the whole fleet)."""
        ...

    def sample(self, now: float, allocation: Mapping[str, str]) -> list[NodeTelemetry]:
        """One telemetry batch per node. `allocation` (`node/index` -> job) lets a simulator derive activity."""
        ...


class TelemetryOnly:
    """A source whose inventory someone else publishes (Kubernetes discovery): it reports telemetry only."""

    def __init__(self, source: TelemetrySource) -> None:
        self.source = source

    def inventory(self, now: float) -> list[NodeInventory]:
        return []

    def sample(self, now: float, allocation: Mapping[str, str]) -> list[NodeTelemetry]:
        return self.source.sample(now, allocation)
