"""Job events with absurd times are garbage, refused by their decoder (and so dead-lettered by the scheduler's
consumer): a JobFinished from 1.7e308 to -1.7e308 used to be applied, its job's run time became infinite, and the
record written with it (msgspec writes infinity as null) could not be read back (found by review)."""

import msgspec
import pytest

from chamber.common.codec import Decoder
from chamber.common.contracts import JobEvent, JobFinished, JobStarted


@pytest.mark.parametrize("body", [
    {"kind": "JobFinished", "job_id": "j", "attempt": 1, "finished_at": 1.7e308, "started_at": -1.7e308},
    {"kind": "JobStopped", "job_id": "j", "attempt": 1, "stopped_at": 1e13},
    {"kind": "JobStarted", "job_id": "j", "attempt": 1, "started_at": -1e300},
])  # fmt: skip
def test_a_job_event_with_an_absurd_time_is_refused(body: dict[str, object]) -> None:
    with pytest.raises(msgspec.ValidationError, match="_at"):
        msgspec.convert(body, JobEvent)


def test_real_times_pass() -> None:
    decoder = Decoder(JobEvent)
    for event in (JobStarted(job_id="j", attempt=1, started_at=1_796_000_000.0),
                  JobFinished(job_id="j", attempt=1, finished_at=0.0, started_at=-5.0)):  # fmt: skip
        assert decoder.decode(msgspec.json.encode(event)) == event
