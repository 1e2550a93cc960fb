"""The gateway's intake gate: a submit waits while `limit` stored submits are not yet taken in by the scheduler,
first come first served, never longer than `max_wait_s`; submits not taken in within `forget_s` stop counting."""

import asyncio

from chamber.gateway.intake import IntakeGate


async def _admitted_within(gate: IntakeGate, job_id: str, seconds: float) -> bool:
    try:
        await asyncio.wait_for(gate.admit(job_id), seconds)
    except TimeoutError:
        return False
    return True


async def test_below_the_limit_a_submit_goes_through_at_once() -> None:
    gate = IntakeGate(3)
    for job in ("a", "b", "c"):
        assert await _admitted_within(gate, job, 0.05)
    assert len(gate) == 3


async def test_at_the_limit_a_submit_waits_until_one_is_taken_in() -> None:
    gate = IntakeGate(2, max_wait_s=10.0, forget_s=10.0)
    await gate.admit("a")
    await gate.admit("b")
    waiting = asyncio.create_task(gate.admit("c"))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    gate.taken("a")
    await asyncio.wait_for(waiting, 1.0)
    assert len(gate) == 2


async def test_waiting_submits_go_in_the_order_they_came() -> None:
    gate = IntakeGate(1, max_wait_s=10.0, forget_s=10.0)
    await gate.admit("first")
    order: list[str] = []

    async def submit(job: str) -> None:
        await gate.admit(job)
        order.append(job)

    tasks = []
    for job in ("w1", "w2", "w3"):
        tasks.append(asyncio.create_task(submit(job)))
        await asyncio.sleep(0.01)  # they arrive in this order
    for taken in ("first", "w1", "w2"):
        gate.taken(taken)
        await asyncio.sleep(0.02)
    await asyncio.wait_for(asyncio.gather(*tasks), 1.0)
    assert order == ["w1", "w2", "w3"]


async def test_a_newcomer_does_not_pass_submits_already_waiting() -> None:
    gate = IntakeGate(1, max_wait_s=10.0, forget_s=10.0)
    await gate.admit("a")
    early = asyncio.create_task(gate.admit("early"))
    await asyncio.sleep(0.02)
    gate.taken("a")  # one place: the one already waiting has it
    late = asyncio.create_task(gate.admit("late"))
    await asyncio.wait_for(early, 1.0)
    await asyncio.sleep(0.05)
    assert not late.done()
    gate.taken("early")
    await asyncio.wait_for(late, 1.0)


async def test_no_submit_waits_longer_than_max_wait() -> None:
    """A scheduler that is down never stops intake: the stream keeps the submits until it is back."""
    gate = IntakeGate(1, max_wait_s=0.2, forget_s=10.0)
    await gate.admit("a")
    loop = asyncio.get_running_loop()
    started = loop.time()
    await asyncio.wait_for(gate.admit("b"), 2.0)
    assert 0.15 <= loop.time() - started < 1.0
    assert len(gate) == 2


async def test_a_submit_not_taken_in_for_forget_s_no_longer_counts() -> None:
    gate = IntakeGate(1, max_wait_s=10.0, forget_s=0.2)
    await gate.admit("a")
    loop = asyncio.get_running_loop()
    started = loop.time()
    await asyncio.wait_for(gate.admit("b"), 2.0)  # "a" is forgotten after 0.2 s: "b" goes then
    assert 0.15 <= loop.time() - started < 1.0
    assert len(gate) == 1


async def test_several_places_freed_at_once_let_as_many_waiting_submits_go() -> None:
    gate = IntakeGate(2, max_wait_s=10.0, forget_s=10.0)
    await gate.admit("a")
    await gate.admit("b")
    waiting = [asyncio.create_task(gate.admit(job)) for job in ("c", "d")]
    await asyncio.sleep(0.02)
    gate.taken("a")
    gate.taken("b")
    await asyncio.wait_for(asyncio.gather(*waiting), 1.0)


async def test_without_a_limit_nothing_waits_or_is_counted() -> None:
    gate = IntakeGate(0)
    for i in range(1000):
        await gate.admit(f"j{i}")
    assert len(gate) == 0
    gate.taken("j1")  # a record seen for a job never counted is ignored


async def test_a_woken_submit_whose_client_left_gives_its_place_to_the_next() -> None:
    gate = IntakeGate(1, max_wait_s=10.0, forget_s=10.0)
    await gate.admit("a")
    leaving = asyncio.create_task(gate.admit("leaving"))
    staying = asyncio.create_task(gate.admit("staying"))
    await asyncio.sleep(0.02)
    gate.taken("a")  # "leaving" is woken with the place kept for it...
    leaving.cancel()  # ...but its request is cancelled before it runs
    await asyncio.wait_for(staying, 1.0)
    assert len(gate) == 1
