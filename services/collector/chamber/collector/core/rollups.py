"""Rollups for the dashboard and `GET /v1/fleet/history`: 1-minute, 1-hour and 1-day averages.

Each resolution keeps a bounded ring of finished buckets (1 min for a day, 1 h for 30 days, 1 day for a year)
and the bucket being filled. A point is the mean of the snapshots that fell into its bucket, except for the
ratios of GPUs, which are weighted by the GPUs they are ratios of: a bucket's `idle_ratio` is its idle GPU-time
over its healthy GPU-time (docs/metrics.md), not the mean of the snapshots' ratios, which would count a snapshot
of a fleet half cordoned as much as one of the whole fleet.
"""

from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from chamber.common.contracts import RollupPoint
from chamber.common.metrics_names import METRICS

RESOLUTIONS: dict[str, tuple[float, int]] = {"1m": (60.0, 1440), "1h": (3600.0, 720), "1d": (86400.0, 400)}
MINUTE = "1m"
DAY_S = 86400.0


def _healthy(values: Mapping[str, float]) -> float:
    return float(values.get("gpus_healthy", 0.0))


def _known(values: Mapping[str, float]) -> float:
    return _healthy(values) - float(values.get("gpus_activity_unknown", 0.0))


WEIGHTS: dict[str, Callable[[Mapping[str, float]], float]] = {
    "utilization": _known,
    "efficiency_score": _known,
    "allocation_ratio": _healthy,
    "idle_ratio": _healthy,
}
"""A ratio metric -> the GPUs of a snapshot it is a ratio of (its weight in a bucket)."""


@dataclass
class _Bucket:
    start: float
    sums: dict[str, float] = field(default_factory=lambda: dict.fromkeys(METRICS, 0.0))
    weights: dict[str, float] = field(default_factory=lambda: dict.fromkeys(WEIGHTS, 0.0))
    samples: int = 0

    def add(self, values: Mapping[str, float]) -> None:
        """Take in one snapshot."""
        self._take(values, 1)

    def fold(self, point: RollupPoint) -> None:
        """Take in a finished finer point as the snapshots it was made of (its means times its samples)."""
        self._take(point.values, point.samples)

    def _take(self, values: Mapping[str, float], n: int) -> None:
        """`n` snapshots whose means are `values`."""
        for k in METRICS:
            value = float(values.get(k, 0.0))
            weigh = WEIGHTS.get(k)
            if weigh is None:
                self.sums[k] += value * n
            else:
                weight = weigh(values) * n
                self.sums[k] += value * weight
                self.weights[k] += weight
        self.samples += n

    def value(self, metric: str) -> float:
        if metric in WEIGHTS:
            weight = self.weights[metric]
            return self.sums[metric] / weight if weight else 0.0
        return self.sums[metric] / self.samples

    def point(self, resolution: str) -> RollupPoint:
        values = {k: self.value(k) for k in METRICS}
        return RollupPoint(resolution=resolution, start=self.start, values=values, samples=self.samples)


class Rollups:
    def __init__(self) -> None:
        self.done: dict[str, deque[RollupPoint]] = {r: deque(maxlen=keep) for r, (_, keep) in RESOLUTIONS.items()}
        self._open: dict[str, _Bucket] = {}

    def add(self, at: float, values: Mapping[str, float]) -> list[RollupPoint]:
        """Fold in one snapshot's `METRICS` (with `gpus_activity_unknown`, which weighs the activity ratios);
        returns the points that this snapshot closed."""
        closed = []
        for res, (width, _) in RESOLUTIONS.items():
            start = at - at % width
            current = self._open.get(res)
            if current is not None and current.start != start:
                point = current.point(res)
                self.done[res].append(point)
                closed.append(point)
                current = None
            if current is None:
                current = self._open[res] = _Bucket(start)
            current.add(values)
        return closed

    def restore(self, minutes: Iterable[RollupPoint], now: float) -> int:
        """Before the first `add`: the open buckets coarser than a minute, from the minutes already published in them
        (a collector that restarts keeps its hour and its day); how many minutes were taken. The minute open at the
        restart is lost (at most one minute of each)."""
        taken = 0
        for point in sorted(minutes, key=lambda p: p.start):
            if point.resolution != MINUTE or point.samples <= 0 or point.start >= now - now % 60.0:
                continue
            used = False
            for res, (width, _) in RESOLUTIONS.items():
                start = now - now % width
                if res == MINUTE or not start <= point.start < start + width:
                    continue
                bucket = self._open.get(res)
                if bucket is None:
                    bucket = self._open[res] = _Bucket(start)
                bucket.fold(point)
                used = True
            taken += used
        return taken

    def series(self, metric: str, resolution: str, since: float) -> list[tuple[float, float]]:
        points = [(p.start, p.values[metric]) for p in self.done[resolution] if p.start >= since]
        current = self._open.get(resolution)
        if current is not None and current.samples and current.start >= since:
            points.append((current.start, current.value(metric)))
        return points
