"""The gateway's in-memory job index: every job not ended, and of those ended the ones submitted last; newest first,
each job once, whatever order records arrive in (a restart's follow, an old job read again by id)."""

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chamber.common.contracts import TERMINAL_STATES, JobRecord, JobState
from chamber.gateway import jobs_index
from chamber.gateway.jobs_index import JobsIndex
from tests.support.builders import make_job


def _job(i: int, state: JobState = JobState.PENDING, version: int = 1) -> JobRecord:
    return msgspec.structs.replace(make_job(f"j{i:04d}").at(1000.0 + i).build(), state=state, version=version)


def test_the_oldest_ended_jobs_go_and_active_ones_stay() -> None:
    index = JobsIndex(keep_finished=2)
    index.upsert(_job(0))  # the oldest job, still waiting
    for i in range(1, 5):
        index.upsert(_job(i, JobState.SUCCEEDED))
    assert [r.id for r in index.newest()] == ["j0004", "j0003", "j0000"]
    assert index.finished == 2
    index.upsert(_job(0, JobState.FAILED, version=2))  # it ends: now the oldest ended job, so it goes
    assert [r.id for r in index.newest()] == ["j0004", "j0003"]


def test_an_old_job_read_again_by_id_is_listed_once_and_goes_again() -> None:
    index = JobsIndex(keep_finished=1)
    index.upsert(_job(1, JobState.SUCCEEDED))
    index.upsert(_job(2, JobState.SUCCEEDED))
    assert index.upsert(_job(1, JobState.SUCCEEDED))  # (GET /v1/jobs/j0001 read it from the KV)
    assert [r.id for r in index.newest()] == ["j0002"]
    index.upsert(_job(3))
    assert [r.id for r in index.newest()] == ["j0003", "j0002"]


def test_places_left_behind_are_compacted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jobs_index, "COMPACT_AT", 8)
    index = JobsIndex(keep_finished=4)
    for i in range(100):
        index.upsert(_job(i, JobState.SUCCEEDED))
    assert len(index._order) < 4 + 2 * 8, "the order does not keep every job ever seen"
    assert [r.id for r in index.newest()] == ["j0099", "j0098", "j0097", "j0096"]


_ops = st.lists(
    st.tuples(
        st.integers(0, 30), st.sampled_from([JobState.PENDING, JobState.RUNNING, *TERMINAL_STATES]), st.integers(1, 4)
    ),
    max_size=120,
)


@settings(max_examples=300)
@given(ops=_ops, keep=st.integers(0, 6))
def test_the_index_holds_what_the_rule_says_in_order(ops: list[tuple[int, JobState, int]], keep: int) -> None:
    """Against a model that keeps every record ever seen: the index holds each job's newest version if the job has
    not ended, and the `keep` ended jobs submitted last; `newest` lists them newest first, once each, also when an
    ended job it dropped is read again."""
    index = JobsIndex(keep_finished=keep)
    seen: dict[str, JobRecord] = {}
    ended_order: list[str] = []  # when each job was first seen ended (ended jobs never come back)
    for i, state, version in ops:
        record = _job(i, state, version)
        known = seen.get(record.id)
        if known is not None and known.state in TERMINAL_STATES:
            index.upsert(known)  # an ended record never changes: this is a read of it again (GET by id)
            continue
        if known is None or known.version < version:
            seen[record.id] = record
            if state in TERMINAL_STATES:
                ended_order.append(record.id)
        index.upsert(record)
        ended = sorted((r for r in seen.values() if r.state in TERMINAL_STATES),
                       key=lambda r: (r.submitted_at, r.id))  # fmt: skip
        kept_ended = {r.id for r in ended[max(0, len(ended) - keep) :]} if keep else set()
        want = [r for r in seen.values() if r.state not in TERMINAL_STATES or r.id in kept_ended]
        want.sort(key=lambda r: (r.submitted_at, r.id), reverse=True)
        assert [r.id for r in index.newest()] == [r.id for r in want]
        assert all(index.records[r.id] == r for r in want)
        assert len(index.records) == len(want)
        assert len(set(index._order)) == len(index._order), "each job has one place in the order"
