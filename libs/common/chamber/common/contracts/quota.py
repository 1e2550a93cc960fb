"""The quota service's published view of each team's usage (the fair-share arithmetic comes later)."""

from chamber.common.contracts.base import Contract, Event


class TeamUsage(Contract, frozen=True):
    team: str
    gpus_running: int = 0
    jobs_running: int = 0
    jobs_pending: int = 0
    gpus_pending: int = 0


class QuotaState(Event, frozen=True):
    teams: dict[str, TeamUsage]
    computed_at: float
