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


class IntakeGate:
    def __init__(self, limit: int, *, max_wait_s: float = 1.0, forget_s: float = 2.0) -> None:
        self.limit = limit
        """Open submits that make new ones wait; 0: no limit."""
        self.max_wait_s = max_wait_s
        self.forget_s = forget_s
        self._open: OrderedDict[str, float] = OrderedDict()
        """Job id -> when it was admitted (the loop's clock), oldest first."""
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._woken = 0
        """Waiters woken with a place kept for them, not yet admitted (a newcomer may not take those places)."""

    def __len__(self) -> int:
        return len(self._open)

    async def admit(self, job_id: str) -> None:
        """Wait until fewer than `limit` submits are open (at most `max_wait_s`), then count `job_id` as open."""
        if not self.limit:
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        self._forget(now)
        self._wake()  # (places freed by forgetting go to those already waiting)
        if len(self._open) + self._woken < self.limit and not any(not w.done() for w in self._waiters):
            self._open[job_id] = now
            return
        deadline = now + self.max_wait_s
        turn: asyncio.Future[None] = loop.create_future()
        self._waiters.append(turn)
        try:
            while not turn.done() and now < deadline:
                wake_at = deadline
                if self._open:
                    wake_at = min(wake_at, next(iter(self._open.values())) + self.forget_s)
                await asyncio.wait([turn], timeout=max(0.0, wake_at - now))
                now = loop.time()
                if not turn.done():  # places may have been freed by forgetting: the first waiters get them
                    self._forget(now)
                    self._wake()
        except BaseException:  # the request was cancelled (its client left): its place goes to the next
            self._leave(turn)
            self._wake()
            raise
        self._leave(turn)
        self._open[job_id] = now
        self._wake()  # more places may be free than this one

    def _leave(self, turn: "asyncio.Future[None]") -> None:
        if turn.done() and not turn.cancelled():
            self._woken -= 1  # the place kept for it is taken now (or given back)
        else:
            turn.cancel()  # out of the queue (`_wake` skips it)

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

    def _wake(self) -> None:
        """Wake waiters, first come first, for as many places as are free."""
        while self._waiters and len(self._open) + self._woken < self.limit:
            turn = self._waiters.popleft()
            if not turn.done():
                turn.set_result(None)
                self._woken += 1
