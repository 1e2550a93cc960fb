"""The job records: compare-and-set writes, and a start-up read that never misses a record."""

import pytest

from chamber.common.bus import Bus
from chamber.common.jobstore import JobStore, StaleWrite
from tests.support.builders import make_job

pytestmark = pytest.mark.integration


async def test_load_all_sees_every_record_at_its_latest_revision(bus: Bus) -> None:
    store = await JobStore.open(bus)
    revisions = {}
    for i in range(300):
        record = make_job(f"j{i}").build()
        revisions[record.id] = await store.create(record)
    first = make_job("j0").build()
    revisions["j0"] = await store.update(first, revisions["j0"] or 0)
    for _ in range(5):
        loaded = await store.load_all()
        assert len(loaded) == 300, "a partial view would release live claims"
        assert {k: rev for k, (_, rev) in loaded.items()} == revisions
    with pytest.raises(StaleWrite):
        await store.update(first, 1)
