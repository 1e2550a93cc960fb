"""The gateway's intake gate: a submit waits while `limit` stored submits are not yet taken in by the scheduler,
first come first served, never longer than `max_wait_s`; submits not taken in within `forget_s` stop counting."""

import asyncio
import types

import pytest

from chamber.common.bus import PublishError
from chamber.gateway import jobs
from chamber.gateway.errors import Unavailable
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


async def test_waiting_submits_do_not_all_wake_at_every_forgetting() -> None:
    """The scheduler is down (nothing is taken in): one timer forgets the oldest open submit and wakes the first
    waiter; every waiter waking at every forgetting made the gate's cost grow with the square of the arrival rate."""
    gate = IntakeGate(10, max_wait_s=1.0, forget_s=0.3)
    calls = 0
    real = gate._forget

    def counted(now: float) -> None:
        nonlocal calls
        calls += 1
        real(now)

    gate._forget = counted  # type: ignore[method-assign]
    tasks = []
    for i in range(300):  # 300 submits over ~1.5 s, none taken in
        tasks.append(asyncio.create_task(gate.admit(f"j{i}")))
        await asyncio.sleep(0.005)
    await asyncio.gather(*tasks)
    assert calls <= 3 * len(tasks), f"{calls} forget passes for {len(tasks)} submits"


async def test_submits_that_gave_up_waiting_do_not_pile_up() -> None:
    """While the gate stays full (the scheduler down, submits going ahead after `max_wait_s`), the waits given up
    are dropped from the queue, not kept one per submit for as long as the outage lasts."""
    gate = IntakeGate(2, max_wait_s=0.02, forget_s=60.0)
    await gate.admit("a")
    await gate.admit("b")
    await asyncio.gather(*(gate.admit(f"w{i}") for i in range(2000)))
    assert len(gate._waiters) < 200, f"{len(gate._waiters)} given-up waits kept"


async def test_a_submit_admitted_again_while_open_keeps_forgetting_in_order() -> None:
    """A retry of a submit still open (an idempotent retry racing the first) is not new work: it neither waits nor
    moves the submit's time, so older submits behind it are still forgotten on time."""
    gate = IntakeGate(3, max_wait_s=5.0, forget_s=0.6)
    loop = asyncio.get_running_loop()
    await gate.admit("a")
    await asyncio.sleep(0.1)
    await gate.admit("b")
    await asyncio.sleep(0.4)
    await gate.admit("a")  # the retry
    await gate.admit("c")  # full
    started = loop.time()
    await gate.admit("d")  # "a" is forgotten 0.6 s after its first admission
    assert loop.time() - started < 0.4, f"waited {loop.time() - started:.2f} s"


def _gateway(gate: IntakeGate, publish: object) -> object:
    return types.SimpleNamespace(
        require_bus=lambda: None,
        jobs=types.SimpleNamespace(records={}),
        intake=gate,
        bus=types.SimpleNamespace(publish=publish, names=types.SimpleNamespace(job_submit=lambda j: f"submit.{j}")),
    )


@pytest.mark.parametrize(
    "failure", [PublishError("no ack"), asyncio.CancelledError(), RuntimeError("encode failed"), TimeoutError()]
)
async def test_a_submit_that_was_not_stored_does_not_keep_its_place(failure: BaseException) -> None:
    """Admitted, then the publish fails or is cancelled (the client left, a gRPC deadline, shutdown): nothing was
    stored, so the submit stops counting at once, not after `forget_s`."""
    gate = IntakeGate(1, max_wait_s=10.0, forget_s=10.0)

    async def publish(*args: object, **kwargs: object) -> None:
        raise failure

    expected = Unavailable if isinstance(failure, PublishError) else type(failure)
    with pytest.raises(expected):
        await jobs._publish_submit(_gateway(gate, publish), "j1", None, 0.0)  # type: ignore[arg-type]
    assert len(gate) == 0


async def test_a_job_taken_in_already_never_waits() -> None:
    """Submitting a job whose record exists again (a retry, or the Kubernetes intake going over every Job after a
    restart) is no new work: it neither waits nor takes a place."""
    gate = IntakeGate(1, max_wait_s=10.0, forget_s=10.0, known=lambda job_id: job_id.startswith("old"))
    await gate.admit("new")
    await asyncio.wait_for(gate.admit("old-1"), timeout=0.5)
    await asyncio.wait_for(gate.admit("old-2"), timeout=0.5)
    assert len(gate) == 1
