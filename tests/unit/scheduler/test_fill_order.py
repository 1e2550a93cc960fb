"""The fill order kept per team and pool marks exactly the jobs `borrowed_jobs` finds by sorting them all, through
any sequence of jobs starting, ending, being added again and having their start time corrected."""

from hypothesis import given, settings
from hypothesis import strategies as st

from chamber.common.contracts import GpuRef, OrgConfig, PoolConfig, QuotaConfig, TeamConfig, TeamQuota
from chamber.common.quota import QuotaBook, borrowed_jobs
from chamber.scheduler.core.fill_order import FillOrder
from chamber.scheduler.core.model import RunningJob


def job(job_id: str, priority: int, started_at: float, gpus: int) -> RunningJob:
    return RunningJob(
        id=job_id, team="a", priority=priority, preemptible=True, gpus=tuple(GpuRef("n", i) for i in range(gpus)),
        started_at=started_at, min_runtime_s=0.0, checkpoint_interval_s=None, checkpoint_grace_s=0.0, est_end=None,
        pool="p",
    )  # fmt: skip


def book(nominal: int) -> QuotaBook:
    team = TeamConfig(name="a", org="o", quotas=[TeamQuota(pool="p", nominal=nominal)])
    config = QuotaConfig(pools=[PoolConfig(name="p", gpu_model="H100")], orgs=[OrgConfig(name="o")], teams=[team])
    return QuotaBook(config, {"p": 64})


ops = st.lists(
    st.tuples(
        st.sampled_from(["add", "remove", "restart"]),
        st.integers(0, 9),
        st.sampled_from([10, 50, 100]),
        st.integers(0, 5).map(float),
        st.integers(1, 8),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(ops=ops, nominal=st.integers(0, 24))
def test_fill_order_marks_what_sorting_every_job_marks(
    ops: list[tuple[str, int, int, float, int]], nominal: int
) -> None:
    order = FillOrder()
    live: dict[str, RunningJob] = {}
    for op, n, priority, started_at, gpus in ops:
        job_id = f"j{n}"
        if op == "add":
            live[job_id] = job(job_id, priority, started_at, gpus)  # again under its id: replaces the one before
            order.add(live[job_id])
        elif op == "remove":
            live.pop(job_id, None)
            order.remove(job_id)
        elif job_id in live:  # its start time corrected: taken out and added again around the change
            order.remove(job_id)
            live[job_id].started_at = started_at
            order.add(live[job_id])
        order.mark_borrowed(nominal)
        expected = borrowed_jobs(
            book(nominal), ((j.id, j.team, j.pool, len(j.gpus), j.priority, j.started_at) for j in live.values())
        )
        assert len(order) == len(live)
        assert {j.id for j in order.jobs()} == set(live)
        assert {j.id for j in live.values() if j.borrowed} == expected
    order.mark_borrowed(None)
    assert not any(j.borrowed for j in live.values())
