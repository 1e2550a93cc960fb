"""What the scheduler decided and did, published for the executor's peers, quota accounting and the dashboard."""

from chamber.common.contracts.base import Event
from chamber.common.contracts.jobs import GpuRef, JobRecord


class JobPlaced(Event, frozen=True):
    job_id: str
    attempt: int
    gpus: list[GpuRef]
    reason: str
    decided_at: float


class JobStateChanged(Event, frozen=True):
    """Every transition of a job record, carrying the new record (consumers keep the highest `version`)."""

    record: JobRecord
    previous: str
    at: float


Decision = JobPlaced | JobStateChanged
