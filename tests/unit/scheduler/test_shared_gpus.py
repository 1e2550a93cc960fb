"""Two running records on one GPU (what a deposed leader's late write could leave): the ledger says which job holds
it. The state must agree with the ledger, and a GPU is free only when every job on it has ended."""

import pytest

from chamber.scheduler.core.controller import Controller
from chamber.scheduler.core.snapshot import build_state
from tests.support.builders import make_job, make_node

SLOTS = (("n1", 0), ("n1", 1))


@pytest.mark.parametrize("order", [("a", "b"), ("b", "a")], ids=["backed first", "backed last"])
@pytest.mark.parametrize("first", ["a", "b"], ids=["the backed one ends first", "the other ends first"])
def test_the_job_the_ledger_backs_holds_the_gpus_and_they_are_free_when_both_ended(
    order: tuple[str, str], first: str
) -> None:
    records = [make_job(job_id).running_on(*SLOTS).build() for job_id in order]
    owners = {f"{node}/{index}": "a/1" for node, index in SLOTS}  # the ledger backs "a"
    state = build_state([make_node("n1").gpus(4).build()], owners, {}, records)
    assert {state.holder[f"n1/{i}"] for i in (0, 1)} == {"a"}
    assert state.index.free_total() == 2
    state.release(first)
    second = "b" if first == "a" else "a"
    assert {state.holder.get(f"n1/{i}") for i in (0, 1)} == {second}, "the other job is on them still"
    assert state.index.free_total() == 2
    state.release(second)
    assert not state.holder
    assert not state.contested
    assert state.index.free_total() == 4


def test_a_job_without_the_ledger_behind_it_holds_nothing_when_it_ends_alone() -> None:
    """A record whose GPUs the ledger gives a job that is not running (its placement was written, then it was
    stopped): the running record holds them until it ends, then they are free."""
    owners = {f"{node}/{index}": "gone/1" for node, index in SLOTS}
    state = build_state([make_node("n1").gpus(4).build()], owners, {}, [make_job("b").running_on(*SLOTS).build()])
    assert {state.holder[f"n1/{i}"] for i in (0, 1)} == {"b"}
    state.release("b")
    assert state.index.free_total() == 4


def test_a_record_re_read_from_the_store_does_not_take_the_gpus_from_the_job_the_ledger_backs() -> None:
    """The unbacked job's record is read again (a stale write refused): the backed job keeps holding the GPUs."""
    control = Controller()
    records = [make_job(job_id).running_on(*SLOTS).build() for job_id in ("a", "b")]
    owners = {f"{node}/{index}": "a/1" for node, index in SLOTS}
    control.load([make_node("n1").gpus(4).build()], records, owners, {})
    control.replace(records[1])
    assert {control.state.holder[f"n1/{i}"] for i in (0, 1)} == {"a"}
    control.replace(records[0])
    assert {control.state.holder[f"n1/{i}"] for i in (0, 1)} == {"a"}, "nor does the backed one lose them"
    assert control.state.index.free_total() == 2
