"""Rollups for the dashboard and `GET /v1/fleet/history`: 1-minute, 1-hour and 1-day averages.

Each resolution keeps a bounded ring of finished buckets (1 min for a day, 1 h for 30 days, 1 day for a year)
and the bucket being filled; a point is the mean of the snapshots that fell into its bucket.
"""

from collections import deque
from collections.abc import Mapping

from chamber.common.contracts import RollupPoint
from chamber.common.metrics_names import METRICS

RESOLUTIONS: dict[str, tuple[float, int]] = {"1m": (60.0, 1440), "1h": (3600.0, 720), "1d": (86400.0, 400)}


class Rollups:
    def __init__(self) -> None:
        self.done: dict[str, deque[RollupPoint]] = {r: deque(maxlen=keep) for r, (_, keep) in RESOLUTIONS.items()}
        self._open: dict[str, tuple[float, dict[str, float], int]] = {}

    def add(self, at: float, values: Mapping[str, float]) -> list[RollupPoint]:
        """Fold in one snapshot; returns the points that this snapshot closed."""
        closed = []
        for res, (width, _) in RESOLUTIONS.items():
            start = at - at % width
            current = self._open.get(res)
            if current is not None and current[0] != start:
                point = self._close(res, current)
                self.done[res].append(point)
                closed.append(point)
                current = None
            if current is None:
                current = (start, dict.fromkeys(METRICS, 0.0), 0)
            s, sums, n = current
            for k in METRICS:
                sums[k] += float(values.get(k, 0.0))
            self._open[res] = (s, sums, n + 1)
        return closed

    @staticmethod
    def _close(res: str, current: tuple[float, dict[str, float], int]) -> RollupPoint:
        start, sums, n = current
        return RollupPoint(resolution=res, start=start, values={k: v / n for k, v in sums.items()}, samples=n)

    def series(self, metric: str, resolution: str, since: float) -> list[tuple[float, float]]:
        points = [(p.start, p.values[metric]) for p in self.done[resolution] if p.start >= since]
        current = self._open.get(resolution)
        if current is not None and current[2] and current[0] >= since:
            points.append((current[0], current[1][metric] / current[2]))
        return points
