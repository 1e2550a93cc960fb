"""Ended jobs' records removed once `CHAMBER_JOB_RETENTION_S` has passed since they ended.

The leading scheduler does it, as the records' only writer, a minute after it takes the lead and then every hour
(`JobStore.remove_ended`). Without it the bucket kept every job ever run: every process reads every current record
at its start, so start-up and a standby's take-over got slower with every day the system ran, and the disk filled.
The cutoff is wall-clock time, as the stream's timestamps are (not the service clock, which a demo may speed up).
"""

import asyncio
import time

from chamber.common.bus import BusError
from chamber.common.jobstore import JobStore
from chamber.common.log import get_logger
from chamber.common.runtime import wait_event

log = get_logger(__name__)

FIRST_S = 60.0
EVERY_S = 3600.0


async def remove_ended_jobs(
    store: JobStore, retention_s: float, stop: asyncio.Event, *, first_s: float = FIRST_S, every_s: float = EVERY_S
) -> None:
    """Until `stop`: remove the records of jobs that ended more than `retention_s` ago (0: never); a round that
    fails (NATS away) is logged and tried again at the next."""
    if retention_s <= 0:
        return
    delay = first_s
    while not await wait_event(stop, delay):
        delay = every_s
        try:
            removed = await store.remove_ended(time.time() - retention_s)
        except BusError as exc:
            log.warning("scheduler.retention_failed", error=str(exc), retry_in_s=every_s)
            continue
        if removed:
            log.info("scheduler.ended_jobs_removed", removed=removed, retention_s=retention_s)
