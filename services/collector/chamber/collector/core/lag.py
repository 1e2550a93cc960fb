"""How long a sample takes to show in the fleet metrics: a bounded histogram of sample-to-snapshot delays.

Every snapshot adds the delay of each GPU sample it is the first to include (from the sample's own time), so
the quantiles are over samples, not batches. Milliseconds up to a minute; anything later counts as a minute.
"""

import numpy as np

MAX_MS = 60_000


class LagHistogram:
    def __init__(self) -> None:
        self.counts = np.zeros(MAX_MS + 1, dtype=np.int64)

    def add(self, lags_ms: "np.typing.ArrayLike", weights: "np.typing.ArrayLike") -> None:
        buckets = np.clip(np.asarray(lags_ms, dtype=np.float64), 0, MAX_MS).astype(np.int64)
        self.counts += np.bincount(buckets, weights=np.asarray(weights, dtype=np.float64), minlength=MAX_MS + 1).astype(
            np.int64
        )

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    def quantile(self, q: float) -> float:
        """The delay (ms, rounded up to the millisecond) that a share `q` of the samples did not exceed."""
        total = self.total
        if not total:
            return float("nan")
        rank = int(np.searchsorted(np.cumsum(self.counts), q * total, side="left"))
        return float(min(rank, MAX_MS) + 1)

    def reset(self) -> None:
        self.counts[:] = 0
