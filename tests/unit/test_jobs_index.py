"""The gateway's in-memory job index: every job not ended, and of those ended the ones that ended last; newest
first, each job once, whatever order records arrive in (the follow, a job read again by id)."""

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chamber.common.contracts import TERMINAL_STATES, JobRecord, JobState
from chamber.common.ledger.ledger import Claim, LedgerSnapshot
from chamber.common.runtime import make_context
from chamber.common.settings import Settings
from chamber.gateway import jobs_index
from chamber.gateway.jobs_index import JobsIndex
from chamber.gateway.state import GatewayState
from tests.support.builders import make_job


def _job(i: int, state: JobState = JobState.PENDING, version: int = 1) -> JobRecord:
    return msgspec.structs.replace(make_job(f"j{i:04d}").at(1000.0 + i).build(), state=state, version=version)


def test_the_jobs_that_ended_first_go_and_active_ones_stay() -> None:
    index = JobsIndex(keep_finished=2)
    index.upsert(_job(0))  # the oldest job, still waiting
    for i in range(1, 5):
        index.upsert(_job(i, JobState.SUCCEEDED))
    assert [r.id for r in index.newest()] == ["j0004", "j0003", "j0000"]
    assert index.finished == 2
    index.upsert(_job(0, JobState.FAILED, version=2))  # it ends last, though submitted first: kept
    assert [r.id for r in index.newest()] == ["j0004", "j0000"]


def test_a_long_job_that_just_ended_still_shows_its_gpus_given_back() -> None:
    """The ledger may still hold an ended job's claim for a moment (the scheduler writes the end, then releases);
    the gateway hides it because it holds the ended record, however long ago the job was submitted."""
    gw = GatewayState(make_context(Settings(gateway_finished_jobs=2), "gateway"))
    gw._on_record(msgspec.structs.replace(make_job("j0000").at(1000.0).running_on(("n1", 0)).build(), version=2))
    for i in range(1, 4):
        gw._on_record(_job(i, JobState.SUCCEEDED))
    gw._on_record(msgspec.structs.replace(gw.records["j0000"], state=JobState.SUCCEEDED, version=3))
    snap = LedgerSnapshot(ready=True, version=1, owners={"n1/0": "j0000/1"}, cordons={},
                          claims={"j0000": Claim(job_id="j0000", attempt=1, slots=("n1/0",))})  # fmt: skip
    assert gw._without_given_back(snap).claims == {}


def test_reading_a_dropped_job_by_id_changes_nothing() -> None:
    """GET of an old job must not count as a change (cached answers, the ledger's re-read, live events)."""
    gw = GatewayState(make_context(Settings(gateway_finished_jobs=1), "gateway"))
    gw._on_record(_job(1, JobState.SUCCEEDED))
    gw._on_record(_job(2, JobState.SUCCEEDED))  # j0001 dropped
    version, generation = gw.jobs.version, gw._ledger_gen
    for _ in range(3):
        gw._on_record(_job(1, JobState.SUCCEEDED), read=True)
    assert (gw.jobs.version, gw._ledger_gen) == (version, generation)
    assert [r.id for r in gw.jobs.newest()] == ["j0002"]


def test_an_older_read_does_not_bring_back_a_job_whose_end_was_dropped() -> None:
    index = JobsIndex(keep_finished=0)
    index.upsert(_job(1, JobState.RUNNING, version=2))
    index.upsert(_job(1, JobState.SUCCEEDED, version=3))  # the follow: ended, and dropped (nothing kept)
    assert not index.refresh(_job(1, JobState.RUNNING, version=2))  # a GET that read v2 before
    assert index.select(limit=10, state=JobState.RUNNING) == []


def test_a_job_that_becomes_active_again_leaves_no_stale_end_behind() -> None:
    index = JobsIndex(keep_finished=1)
    index.upsert(_job(1, JobState.FAILED, version=1))
    index.upsert(_job(1, JobState.PENDING, version=2))
    index.upsert(_job(1, JobState.FAILED, version=3))
    index.upsert(_job(2, JobState.SUCCEEDED))
    assert [r.id for r in index.newest()] == ["j0002"]
    index.upsert(_job(3, JobState.PENDING))
    assert [r.id for r in index.newest()] == ["j0003", "j0002"]
    index.upsert(_job(4, JobState.SUCCEEDED))  # (the first end of j0001 is stale, and skipped)
    assert [r.id for r in index.newest()] == ["j0004", "j0003"]


def test_places_left_behind_are_compacted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jobs_index, "COMPACT_AT", 8)
    index = JobsIndex(keep_finished=4)
    for i in range(100):
        index.upsert(_job(i, JobState.SUCCEEDED))
    assert len(index._order) < 4 + 2 * 8, "the order does not keep every job ever seen"
    assert [r.id for r in index.newest()] == ["j0099", "j0098", "j0097", "j0096"]


_ops = st.lists(
    st.tuples(
        st.integers(0, 30),
        st.sampled_from([JobState.PENDING, JobState.RUNNING, *TERMINAL_STATES]),
        st.integers(1, 4),
        st.booleans(),
    ),
    max_size=120,
)


@settings(max_examples=300)
@given(ops=_ops, keep=st.integers(0, 6))
def test_the_index_holds_what_the_rule_says_in_order(ops: list[tuple[int, JobState, int, bool]], keep: int) -> None:
    """Against a model that keeps every record ever seen: the index holds each job's newest version if the job has
    not ended, and the `keep` jobs that ended last; `newest` lists them newest first, once each. Records come from
    the follow (every write, in order) or from reads by id (`refresh`: any version, an ended job read again)."""
    index = JobsIndex(keep_finished=keep)
    seen: dict[str, JobRecord] = {}
    ended: list[str] = []  # in the order they ended (an ended job never changes: the state machine)
    for i, state, version, read in ops:
        if read:  # a read by id: of a version the KV held at some point (any version not newer than the latest)
            latest = seen.get(f"j{i:04d}")
            if latest is not None:
                index.refresh(latest if version >= latest.version else _job(i, state, version))
            continue
        record = _job(i, state, version)
        known = seen.get(record.id)
        if known is not None and (known.state in TERMINAL_STATES or known.version >= version):
            continue  # the follow brings each job's writes in order, versions rising, none after its end
        seen[record.id] = record
        if state in TERMINAL_STATES:
            ended.append(record.id)
        index.upsert(record)
        kept_ended = set(ended[max(0, len(ended) - keep) :]) if keep else set()
        want = [r for r in seen.values() if r.state not in TERMINAL_STATES or r.id in kept_ended]
        want.sort(key=lambda r: (r.submitted_at, r.id), reverse=True)
        assert [r.id for r in index.newest()] == [r.id for r in want]
        assert all(index.records[r.id] == r for r in want)
        assert len(index.records) == len(want)
        assert len(set(index._order)) == len(index._order), "each job has one place in the order"
