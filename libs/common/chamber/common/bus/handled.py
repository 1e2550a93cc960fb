"""The stream sequences a consumer handled, so that a message delivered again after it was handled is known.

JetStream delivers at least once: an ack lost in a NATS restart, or an ack wait that passed while the service was
busy, brings a handled message back, and a service that counts what it is given (the health service counts faults
against windows) would count it twice. A set of every sequence handled grows with the stream (12,500 nodes send
12,500 messages a second, and a redelivery comes after the ack wait, 30 s); the sequences a consumer of all of a
stream's subjects handles (the health service's, of TELEMETRY) are nearly contiguous, so they are kept as ranges
(one, mostly; a message that failed and waits for its redelivery, or garbage, splits one), and only those within
`span` of the newest. (A consumer of a few subjects of a busy stream would keep a range per gap: not a use for
this.)
"""

from bisect import bisect_right


class HandledSequences:
    def __init__(self, span: int) -> None:
        self.span = span
        self._lo: list[int] = []
        self._hi: list[int] = []
        """Disjoint, non-adjacent ranges [lo, hi] of sequences handled, in order."""

    def __len__(self) -> int:
        """How many ranges are kept."""
        return len(self._lo)

    def __contains__(self, seq: int) -> bool:
        i = bisect_right(self._lo, seq) - 1
        return i >= 0 and seq <= self._hi[i]

    def add(self, seq: int) -> None:
        lo, hi = self._lo, self._hi
        if hi and seq == hi[-1] + 1:  # the common case: the next one
            hi[-1] = seq
        else:
            i = bisect_right(lo, seq) - 1  # the range starting at or before `seq`, if any
            if i >= 0 and seq <= hi[i]:
                return
            joins_left = i >= 0 and hi[i] == seq - 1
            joins_right = i + 1 < len(lo) and lo[i + 1] == seq + 1
            if joins_left and joins_right:
                hi[i] = hi[i + 1]
                del lo[i + 1], hi[i + 1]
            elif joins_left:
                hi[i] = seq
            elif joins_right:
                lo[i + 1] = seq
            else:
                lo.insert(i + 1, seq)
                hi.insert(i + 1, seq)
        floor = hi[-1] - self.span
        while hi[0] < floor:
            del lo[0], hi[0]
        lo[0] = max(lo[0], floor)
