"""What the scheduler asks of an executor. Every method is idempotent per (job, attempt).

An executor reports back only through the bus (`JobStarted`, `JobFinished`, `JobStopped` on
`jobs.lifecycle.<job>`), so the scheduler handles reports from a simulated, a Kubernetes or a remote executor
the same way, and a report published before a crash is still applied after it.
"""

from collections.abc import Iterable
from typing import Protocol

from chamber.common.contracts import JobRecord


class Executor(Protocol):
    async def launch(self, record: JobRecord) -> None:
        """Start the record's current attempt on its placement (Kubernetes: inject affinity, unsuspend)."""
        ...

    async def stop(self, record: JobRecord, reason: str, grace_s: float = 0.0) -> None:
        """Stop the record's current attempt after `grace_s` seconds to checkpoint (Kubernetes: suspend the Job
        with that termination grace period). Reports `JobStopped`, graceful when `grace_s` > 0."""
        ...

    async def resync(self, records: Iterable[JobRecord]) -> None:
        """After a restart: make reality match the records that hold GPUs."""
        ...

    async def close(self) -> None: ...
