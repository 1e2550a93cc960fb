"""The Kubernetes intake's worker awaits a Job's turn at the gate as a task, so that the Job's deletion can end the
wait (`Intake._unqueue`). Neither way of ending it may leave the gate counting a place nobody uses: a turn
cancelled as it comes gives the place to the next waiter, and a worker stopped just after its turn came gives the
place back (found by review)."""

import asyncio
from collections.abc import Callable
from typing import Any, cast

from chamber.gateway.intake import IntakeGate
from chamber.gateway.kube_intake import Intake


def worker_only(gate: IntakeGate) -> Intake:
    """An intake with only what `_send_waiting` touches before it publishes."""
    intake = object.__new__(Intake)
    intake.gate = gate
    intake.waiting = {}
    intake.submitted = set()
    intake._turn = None
    intake._sending = None
    intake._cancel_after = set()
    intake._arrived = asyncio.Event()
    return intake


async def until(condition: Callable[[], bool]) -> None:
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("never")


async def test_a_turn_cancelled_as_it_comes_gives_the_place_to_the_next() -> None:
    gate = IntakeGate(1, max_wait_s=30.0, forget_s=30.0)
    await gate.admit("x")
    first = asyncio.ensure_future(gate.admit("a"))
    second = asyncio.ensure_future(gate.admit("b"))
    await asyncio.sleep(0)
    gate.taken("x")  # wakes a's turn ...
    first.cancel()  # ... and a's Job is deleted in the same loop turn
    await asyncio.wait_for(second, 1.0)
    assert first.cancelled()
    assert len(gate) == 1  # b's place, nobody else's


async def test_a_worker_stopped_just_after_its_turn_came_gives_the_place_back() -> None:
    gate = IntakeGate(1, max_wait_s=30.0, forget_s=30.0)
    await gate.admit("x")
    intake = worker_only(gate)
    intake.waiting["j"] = cast(Any, object())
    worker = asyncio.ensure_future(intake._send_waiting(asyncio.Event()))
    await until(lambda: intake.at_the_gate == "j")
    turn = cast(tuple[str, asyncio.Task[None]], intake._turn)[1]
    gate.taken("x")
    await until(turn.done)
    worker.cancel()  # a shutdown, in the loop turn the gate let j through
    await asyncio.gather(worker, return_exceptions=True)
    assert "j" in intake.waiting  # never submitted
    assert len(gate) == 0, "j holds a place in the gate though it was never submitted"
