"""The cycle answers a parked group's turn at once when its team is at or above its guarantee and runs no
lower-priority preemptible work (`_borrower_only`): such a group is admitted by borrowing alone, for at most what
the cohort can lend within the team's borrowing limit. That shortcut must give exactly what the full admission
check (`_admitted`, asked size by size) gives, on any quota, usage and cohort: property-tested here."""

from hypothesis import given, settings
from hypothesis import strategies as st

from chamber.scheduler.core.cycle import CycleContext, _Cycle
from chamber.scheduler.core.state import SchedulingState
from tests.support.builders import pool_quota

TEAMS = ["a", "b", "c", "d", "e"]


@st.composite
def situations(draw: st.DrawFn) -> tuple[SchedulingState, CycleContext, tuple[str, str, bool, int]]:
    teams = [
        (t, draw(st.sampled_from(["c1", "c2"])), draw(st.integers(0, 16)), draw(st.none() | st.integers(0, 12)))
        for t in TEAMS
    ]
    capacity = sum(nominal for _, _, nominal, _ in teams) + draw(st.integers(0, 16))  # unassigned GPUs lent too
    state = SchedulingState()
    state.set_quota(pool_quota(capacity, *teams))
    for team in TEAMS:
        state.usage.add(team, "default", draw(st.integers(0, 24)))
        for priority in draw(st.lists(st.sampled_from([100, 200, 300]), max_size=3)):
            state.preemptible_usage.setdefault(team, {}).setdefault("default", {})[priority] = draw(st.integers(0, 4))
    ctx = CycleContext(0.0, borrowing=draw(st.booleans()), reclaimable=draw(st.booleans()))
    group = (draw(st.sampled_from(TEAMS)), "default", draw(st.booleans()), draw(st.sampled_from([100, 200, 300])))
    return state, ctx, group


@settings(max_examples=400, deadline=None)
@given(situations())
def test_the_borrower_shortcut_admits_exactly_what_the_full_check_admits(
    situation: tuple[SchedulingState, CycleContext, tuple[str, str, bool, int]],
) -> None:
    state, ctx, group = situation
    cycle = _Cycle(state, ctx)
    most = cycle._borrower_only(group)
    if most is None:
        return  # the full checks decide
    for gpus in range(1, 40):
        assert not cycle._admitted(group, gpus, borrowing=False), gpus  # nothing is admitted directly
        assert cycle._admitted(group, gpus, borrowing=True) == (gpus <= most), gpus
