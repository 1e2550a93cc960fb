"""What the ledger says about a GPU slot that must not be claimed, as a typed value.

The scheduler decides how to move a job off a cordoned GPU from the cordon's `severity`: `fatal` interrupts the
job at once (its GPU is failing now), `degraded` drains it with its checkpoint grace. Severity is a field, not a
word at the start of a reason that every reader has to parse.
"""

from typing import Literal

from chamber.common.contracts.base import Contract

Severity = Literal["fatal", "degraded"]


class Cordon(Contract, frozen=True):
    severity: Severity
    reason: str
    owner: str = "health"
    """Who asserts it (the health service owns every cordon today; operators cordon through it)."""

    @property
    def fatal(self) -> bool:
        return self.severity == "fatal"

    def describe(self) -> str:
        return f"{self.severity}: {self.reason}"
