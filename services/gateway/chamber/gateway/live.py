"""Fan-out of live changes (job records, fleet totals, health verdicts) to Server-Sent-Event subscribers.

Each subscriber has a bounded queue: a client too slow to keep up is not allowed to grow the gateway's memory; it
gets one `resync` event (re-read everything) and loses what did not fit. Members only receive their teams' jobs.

A stream outlives its first authentication: the readers re-check their token (`TokenStore.authenticate`, which
follows revocations) before every delivery and at least every `REVALIDATE_S`, and end the stream once it fails.
"""

import asyncio
from dataclasses import dataclass, field

TOPICS = ("job", "fleet", "health")
QUEUE_SIZE = 2048
REVALIDATE_S = 1.0
"""The longest a stream goes without re-checking its token."""


@dataclass(eq=False)
class Subscriber:
    topics: frozenset[str]
    teams: frozenset[str] | None
    """None: every team's jobs."""
    queue: asyncio.Queue[tuple[str, bytes] | None] = field(default_factory=lambda: asyncio.Queue(QUEUE_SIZE))
    lagged: bool = False

    def offer(self, topic: str, data: bytes) -> None:
        if self.lagged:
            return
        try:
            self.queue.put_nowait((topic, data))
        except asyncio.QueueFull:
            self.lagged = True

    def close(self) -> None:
        """Wake the reader and end its stream (queue full or not)."""
        while True:
            try:
                self.queue.put_nowait(None)
                return
            except asyncio.QueueFull:
                self.queue.get_nowait()


class Broadcaster:
    def __init__(self) -> None:
        self._subscribers: set[Subscriber] = set()

    def __len__(self) -> int:
        return len(self._subscribers)

    def subscribe(self, topics: frozenset[str], teams: frozenset[str] | None) -> Subscriber:
        sub = Subscriber(topics=topics, teams=teams)
        self._subscribers.add(sub)
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        self._subscribers.discard(sub)

    def publish(self, topic: str, data: bytes, team: str | None = None) -> None:
        for sub in self._subscribers:
            if topic in sub.topics and (team is None or sub.teams is None or team in sub.teams):
                sub.offer(topic, data)

    def close(self) -> None:
        for sub in list(self._subscribers):
            sub.close()
        self._subscribers.clear()
