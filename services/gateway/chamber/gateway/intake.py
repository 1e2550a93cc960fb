"""Intake backpressure: a gateway holds a submit back, briefly, while too many of the submits it stored are not yet
taken in by the scheduler.

A submit is stored on the JOBS stream and answered at once; the scheduler takes it in (writes its record) when it
gets to it. When submits come faster than the scheduler takes them in, the difference waits on the stream, unseen
by the queue, and every later job waits behind it: under a burst, submit-to-placed latency grew without bound
while every submit was answered in milliseconds. So each gateway counts the submits it stored whose record it has
not yet seen, and while `limit` are open a new submit waits (first come, first served) until one is taken in, as
Slurm's `sbatch` waits ("temporarily unable to accept job, sleeping and retrying") when its controller is busy.
Never for long: after `max_wait_s` it goes ahead anyway, and a submit not taken in within `forget_s` no longer
counts, so a scheduler that is down or failing over slows intake a little and never stops it (the stream keeps
every submit until the scheduler is back).
"""

import asyncio
from collections import OrderedDict, deque
from collections.abc import Callable


class IntakeGate:
    def __init__(
        self,
        limit: int,
        *,
        max_wait_s: float = 1.0,
        forget_s: float = 2.0,
        known: Callable[[str], bool] = lambda job_id: False,
    ) -> None:
        self.limit = limit
        """Open submits that make new ones wait; 0: no limit."""
        self.known = known
        """Whether a job was taken in already (its record seen): submitting it again is no new work (a retry, or the
        Kubernetes intake going over every Job again after a restart) and never waits."""
        self.max_wait_s = max_wait_s
        self.forget_s = forget_s
        self._open: OrderedDict[str, float] = OrderedDict()
        """Job id -> when it was admitted (the loop's clock), oldest first."""
        self._waiters: deque[asyncio.Future[bool]] = deque()
        """Waiting submits, first come first; each one's future says True when it was woken with a place kept for it,
        False when it gave up waiting (`max_wait_s`)."""
        self._gone = 0
        """Futures in `_waiters` given up (timed out or cancelled), not popped yet."""
        self._woken = 0
        """Waiters woken with a place kept for them, not yet admitted (a newcomer may not take those places)."""
        self._timer: asyncio.TimerHandle | None = None
        """One timer for the next forgetting, while anyone waits (not one per waiter)."""

    def __len__(self) -> int:
        return len(self._open)

    async def admit(self, job_id: str) -> None:
        """Wait until fewer than `limit` submits are open (at most `max_wait_s`), then count `job_id` as open."""
        if not self.limit or self.known(job_id):
            return
        loop = asyncio.get_running_loop()
        self._forget(loop.time())
        self._wake()  # (places freed by forgetting go to those already waiting)
        if job_id in self._open:  # a retry of a submit still open: not new work, counted already
            return
        if len(self._open) + self._woken < self.limit and len(self._waiters) == self._gone:
            self._open[job_id] = loop.time()
            return
        turn: asyncio.Future[bool] = loop.create_future()
        self._waiters.append(turn)
        self._arm(loop)
        # A timer that ends the wait, not `asyncio.wait(timeout=)`: that wraps each wait in a set, a waiter and
        # callbacks, and most submits wait here under a burst.
        timer = loop.call_later(self.max_wait_s, _give_up, turn)
        try:
            await turn
        except BaseException:  # the request was cancelled (its client left): its place goes to the next
            self._leave(turn)
            self._wake()
            raise
        finally:
            timer.cancel()
        self._leave(turn)
        self._open.pop(job_id, None)
        self._open[job_id] = loop.time()
        self._wake()  # more places may be free than this one
        self._arm(loop)

    def _leave(self, turn: "asyncio.Future[bool]") -> None:
        if turn.done() and not turn.cancelled() and turn.result():
            self._woken -= 1  # the place kept for it is taken now (or given back)
            return
        turn.cancel()  # out of the queue (`_wake` skips it)
        self._gone += 1
        if self._gone > 64 and self._gone * 2 > len(self._waiters):
            self._waiters = deque(w for w in self._waiters if not w.done())
            self._gone = 0

    def taken(self, job_id: str) -> None:
        """The scheduler took the job in (its record was seen), or it was never stored: it no longer counts."""
        if self._open.pop(job_id, None) is not None:
            self._wake()

    def _forget(self, now: float) -> None:
        while self._open:
            job_id, at = next(iter(self._open.items()))
            if now - at < self.forget_s:
                return
            del self._open[job_id]

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._timer is None and self._open and len(self._waiters) > self._gone:
            self._timer = loop.call_at(next(iter(self._open.values())) + self.forget_s, self._expire, loop)

    def _expire(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        self._forget(loop.time())
        self._wake()
        self._arm(loop)

    def _wake(self) -> None:
        """Wake waiters, first come first, for as many places as are free."""
        while self._waiters and len(self._open) + self._woken < self.limit:
            turn = self._waiters.popleft()
            if turn.done():
                self._gone -= 1
                continue
            turn.set_result(True)
            self._woken += 1


def _give_up(turn: "asyncio.Future[bool]") -> None:
    """`max_wait_s` passed: the submit goes ahead without a place kept for it."""
    if not turn.done():
        turn.set_result(False)
