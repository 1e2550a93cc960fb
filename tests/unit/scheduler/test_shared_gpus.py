"""Two running records on one GPU (what a deposed leader's late write could leave): the ledger says which job holds
it. The state must agree with the ledger, and ending the other job must not free a GPU that is still held."""

import pytest

from chamber.scheduler.core.snapshot import build_state
from tests.support.builders import make_job, make_node

SLOTS = (("n1", 0), ("n1", 1))


@pytest.mark.parametrize("order", [("a", "b"), ("b", "a")], ids=["backed first", "backed last"])
@pytest.mark.parametrize("ended", ["a", "b"], ids=["the unbacked one ends", "the backed one ends"])
def test_the_job_the_ledger_backs_holds_the_gpus(order: tuple[str, str], ended: str) -> None:
    records = [make_job(job_id).running_on(*SLOTS).build() for job_id in order]
    owners = {f"{node}/{index}": "a/1" for node, index in SLOTS}  # the ledger backs "a"
    state = build_state([make_node("n1").gpus(4).build()], owners, {}, records)
    assert {state.holder[f"n1/{i}"] for i in (0, 1)} == {"a"}
    assert state.index.free_total() == 2
    state.release(ended)
    if ended == "b":  # the job the ledger does not back ends: the GPUs stay the backed job's
        assert {state.holder.get(f"n1/{i}") for i in (0, 1)} == {"a"}
        assert state.index.free_total() == 2
    else:  # the backed job ends: its GPUs are free (the other was stopped for it, or is being stopped)
        assert all(f"n1/{i}" not in state.holder for i in (0, 1))
        assert state.index.free_total() == 4
